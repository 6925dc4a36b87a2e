"""How the Engine's API is read, as dockerd reads it: routes, Go's JSON and numbers, field
names, create bodies, labels, the error format.  The core's bottom layer: it imports no
other group."""
