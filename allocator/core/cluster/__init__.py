"""Cluster-wide state: filter verdicts and scores for every node, ranking and the extender priorities."""
