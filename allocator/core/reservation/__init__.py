"""Reservations in the core: rooms on nodes, owners taking from them, placing them (docs/reservations.md)."""
