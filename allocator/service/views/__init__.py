"""Read models: what status, queue, gpus, explain and history answer, as data.

The CLI (allocator/ops/) renders them; the shim's admin endpoints (shim/admin.py)
serve them as JSON to users who may use Docker but not read the state dir.
"""
