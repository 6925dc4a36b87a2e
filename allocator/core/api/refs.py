"""How dockerd reads a reference to a container (``daemon.GetContainer``): a full id
first, then an exact name, then a unique prefix of an id.

So a reference judged on the container it names now may name another by the time dockerd
looks it up again: a rename in between frees the name, and a reference spelt in
lower-case hex is then read as a prefix of whatever id begins with it.  Whoever judges a
reference judges it on every container it `may_name`.  A name may begin with the ``/``
dockerd stores it with, and a legacy link's alias is a name too (`is_alias`).
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r"[0-9a-f]{1,63}")  # ids are 64 hex digits


def may_be_prefix(ref: str) -> bool:
    """Whether dockerd could read ``ref`` as a prefix of an id other than its own (after
    an exact name, which wins while it exists)."""
    return _PREFIX.fullmatch(ref) is not None


def is_alias(ref: str) -> bool:
    """Whether ``ref`` names a container by a legacy link's alias (``parent/alias``),
    which moves to another container whenever its parent is renamed."""
    return "/" in ref.removeprefix("/")


def may_name(ref: str, container_id: str) -> bool:
    """Whether dockerd could take ``ref`` for the container whose id is ``container_id``
    by reading it as an id or an id prefix."""
    return container_id == ref or (may_be_prefix(ref) and container_id.startswith(ref))
