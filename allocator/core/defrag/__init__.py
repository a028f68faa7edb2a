"""Defragmentation by safe rescheduling: which running pods to move where so that waiting work fits
(docs/defragmentation.md). Pure: the allocator's migration controller, the simulator and the CLI
carry its plans out or print them."""
