"""How the Engine's API is read, as dockerd reads it: routes, Go's JSON and numbers, field
names, create bodies, labels, the error format, the body the shim forwards."""
