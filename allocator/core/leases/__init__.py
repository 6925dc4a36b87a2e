"""The lease life as data: the ledger's contents, calls in flight, holders, what the Engine's
answers and events mean for leases, reconcile, restarts, audit records, and the boot's clock
their stamps are measured on."""
