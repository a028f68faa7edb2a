"""Mid-tier (reclaimable) CPU and memory: the pods bound here and what prod pods leave unused."""
