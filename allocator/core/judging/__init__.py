"""The verdicts: what the plugin answers and how the shim rewrites, per route and per kind of
request (creates, starts, services, Compose, CUDA)."""
