"""Time: limits, idle reclaim, reservations and usage reports."""
