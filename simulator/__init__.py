"""Trace-driven cluster simulator running the production allocator core."""
