"""Node agent: discovers GPU/NVLink/PCIe/NUMA/RDMA topology, health and load; publishes Device CRs."""
