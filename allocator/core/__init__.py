"""Pure allocation and scoring core: plain data in, decisions out. No I/O, no Kubernetes client."""
