"""Reservations (Koordinator's scheduling.koordinator.sh/v1alpha1 Reservation): the book of rooms fed
by the watch cache, the extender's steering of owners, the bind path's placer, and the controller
that places Reservations and keeps their status (docs/reservations.md)."""
