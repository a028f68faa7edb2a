"""Defragmentation by safe rescheduling: the migration controller (leader only) carrying out the
core's defragmentation plans through Reservations and the Eviction API (docs/defragmentation.md)."""
