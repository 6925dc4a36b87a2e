"""The lease life as data: the ledger's contents, calls in flight, holders, what the Engine's
answers and events mean for leases, reconcile, restarts, audit records."""
