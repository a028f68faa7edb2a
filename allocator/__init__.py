"""Central allocator: pure allocation/scoring core plus the scheduler-extender service."""
