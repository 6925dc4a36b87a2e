"""The operator's rules: policy (limits, pools, labels), the owners trusted by name, the fair
line, shared GPUs, swarm settings."""
