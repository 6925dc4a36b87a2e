"""The machine as data: the GPU inventory, CPU cores and memory, health, each GPU's state for
every view."""
