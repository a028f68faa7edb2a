"""One node's state: its device inventory, what is free, and the per-node features the node table caches."""
