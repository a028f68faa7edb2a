"""What the node has: NVML and sysfs read into one topology, with device health and hot-plug triggers."""
