"""What an unknown key in the config file is told: the key it was likely meant to be.

A typo (``placment``) is far likelier than a key from another version, so a close match
is named alone; only with none is every known key listed, so the line stays short.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown(key: str, known: Iterable[str]) -> str:
    """Why ``key`` (its last dotted part is matched) is refused, for ``_fail``'s line."""
    names = sorted(str(k) for k in known)
    leaf = key.rpartition(".")[2]
    close = difflib.get_close_matches(leaf, names, 1)
    if close:
        meant = key[: len(key) - len(leaf)] + close[0]
        return f"unknown key; did you mean '{meant}'?"
    return f"unknown key (known: {', '.join(names)})"
