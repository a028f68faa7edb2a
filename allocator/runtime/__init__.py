"""The allocator's runtime, shared by every component on top of it (the extender, gang scheduling):
the watch cache and hold ledger, the API client, events, TLS, leader election, metrics, certificates,
process config, and the one adapter to the pure core. It imports neither `allocator.extender` nor
`allocator.gang`."""
