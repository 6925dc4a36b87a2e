"""The shim's parts import no circle, counting the imports made only for type checking:
the protocol (shim/splice.py) composes its parts, and the parts see it only through the
narrow interfaces in shim/upstream.py and shim/ports.py; the connection's HTTP
(shim/connection.py and what it uses) is sans I/O."""

from __future__ import annotations

import ast
from pathlib import Path

SHIM = Path(__file__).resolve().parents[2] / "shim"


def all_imports(path: Path) -> set[str]:
    """Every module `path` imports, by its top-level name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
    return found


def shim_imports(path: Path) -> set[str]:
    """The shim modules `path` imports, anywhere in it (``if TYPE_CHECKING:`` included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shim."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "shim":
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("shim."))
    return found - {path.stem}


GRAPH = {p.stem: shim_imports(p) for p in SHIM.glob("*.py")}


def cycles() -> list[str]:
    found, done, path = [], set(), []

    def visit(name: str) -> None:
        if name in path:
            found.append(" -> ".join([*path[path.index(name) :], name]))
            return
        if name in done or name not in GRAPH:
            return
        path.append(name)
        for target in sorted(GRAPH[name]):
            visit(target)
        path.pop()
        done.add(name)

    for name in sorted(GRAPH):
        visit(name)
    return found


def test_no_import_circle_in_the_shim_type_checking_imports_included():
    assert cycles() == []


def test_the_connections_parts_never_import_the_connection_or_the_server():
    parts = ("intercept", "connection", "actions", "collect", "upstream", "ports", "flow")
    wrong = [f"{p} imports {t}" for p in parts for t in GRAPH[p] if t in ("splice", "server")]
    assert wrong == []


# The connection's HTTP: both sides' states, the parser, where heads end, `forward`'s answer.
SANS_IO = ("connection", "actions", "states", "parser", "headlimit", "collect")
IO = {"asyncio", "socket", "selectors", "threading", "time", "os"}


def test_the_connection_is_sans_io_and_reaches_no_io_part_of_the_shim():
    wrong = [
        f"{m} imports {t}"
        for m in SANS_IO
        for t in sorted(all_imports(SHIM / f"{m}.py") & IO | GRAPH[m] - {*SANS_IO, "framing"})
    ]
    assert wrong == []
