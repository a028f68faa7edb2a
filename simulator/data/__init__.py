"""Data the simulator ships: a sample of the openb default trace and the demo workload (README.md)."""
