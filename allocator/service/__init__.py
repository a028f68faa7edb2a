"""Scheduler-extender service: mTLS HTTP server, watch cache, binding, leader election, metrics."""
