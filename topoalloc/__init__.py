"""topoalloc: topology-aware GPU/RDMA allocation for Kubernetes (CLI entry point package)."""

__version__ = "0.1.0"
