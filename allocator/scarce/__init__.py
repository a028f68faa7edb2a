"""Scarce-resource avoidance for pods that never reach the extender: the admission route adding a
preferred node affinity away from GPU nodes to pods that request no device (docs/service.md)."""
