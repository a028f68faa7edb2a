"""Central allocator: the pure allocation/scoring core (`core/`), the runtime on top of it (`runtime/`),
the scheduler extender (`extender/`) and gang scheduling (`gang/`) side by side, wired by `assembly.py`."""
