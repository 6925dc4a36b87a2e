"""The operator's rules: policy (limits, pools, labels), the fair line, shared GPUs, swarm
settings."""
