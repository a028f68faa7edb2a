"""Gangs in the pure core: the planner (every member at once), sibling affinity, queue order,
victim plans, and the gang lifecycle (one step per gang: decisions in, actions out)."""
