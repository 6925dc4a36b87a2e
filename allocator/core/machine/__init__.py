"""The machine as data: the GPU inventory, CPU cores and memory (and what a create asks of
them), health, what each GPU is doing now, each GPU's state for every view."""
