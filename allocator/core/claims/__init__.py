"""DRA claims allocated by the core: per-node solving, placement across nodes, claim usage."""
