"""Effective access: what a container or a build would really reach, from the facts the Engine
and the host resolve."""
