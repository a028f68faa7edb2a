"""The scheduler extender: the mTLS HTTP verbs (filter, prioritize, bind, preempt), the binder, the
health app, and the seam it offers gang scheduling (`GangHooks`). Built on the runtime; never
imports `allocator.gang`."""
