"""DRA claims allocated by topology: the admission gate, the claims controller (gate, allocate,
ungate, re-allocate) and their view of the watch cache (docs/dra.md, "Allocation")."""
