"""Placement mode: every GPU pod placed by topology at admission, whatever its scheduler, and bound by
the cluster's own kube-scheduler (docs/placement.md)."""
