"""Time: limits, idle reclaim, reservations, live usage and usage reports."""
