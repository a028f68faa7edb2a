"""Device choice on one node: `allocate` and one handler per device type (GPU, per-device types)."""
