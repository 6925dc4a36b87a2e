"""The layering docs/design.md's map draws, read from the source (ast, nothing imported).

The library (allocator/) never imports an adapter, except the CLI's entry points that
start one (allocator/ops/cli.py, inside a function); the adapters (plugin/, shim/) never
import the CLI package, and reach neither the Engine client nor the ledger: they ask the
service (allocator/service/lookups.py) and read the read models (allocator/service/views/).  No
module
imports itself back through others, lazy imports included (only ``if TYPE_CHECKING:``
ones are not imports at run time).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("allocator", "plugin", "shim")
ADAPTERS = ("plugin", "shim")
STARTS_ADAPTERS = "allocator.ops.cli"  # cmd_plugin and cmd_shim start them


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def imports(name: str) -> list[tuple[str, bool]]:
    """The project modules ``name`` imports at run time, each with whether the import
    is at module level."""
    tree = ast.parse(MODULES[name].read_text())
    top = {id(n) for n in tree.body}
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in _runtime_nodes(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]  # fmt: skip
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, id(node) in top))
    return found


def test_the_library_imports_no_adapter_but_to_start_one():
    wrong = [
        f"{name} imports {target}"
        for name in MODULES
        if name.startswith("allocator")
        for target, top in imports(name)
        if target.split(".")[0] in ADAPTERS and (name != STARTS_ADAPTERS or top)
    ]
    assert wrong == []


def test_the_adapters_never_import_the_cli_package():
    wrong = [
        f"{name} imports {target}"
        for name in MODULES
        if name.split(".")[0] in ADAPTERS
        for target, _ in imports(name)
        if target.startswith("allocator.ops")
    ]
    assert wrong == []


def test_no_import_cycle():
    graph = {name: sorted({t for t, _ in imports(name)}) for name in MODULES}
    cycles, done, path = [], set(), []

    def visit(name: str) -> None:
        if name in path:
            cycles.append(" -> ".join([*path[path.index(name) :], name]))
            return
        if name in done:
            return
        path.append(name)
        for target in graph[name]:
            visit(target)
        path.pop()
        done.add(name)

    for name in graph:
        visit(name)
    assert cycles == []


def _on_config(node: ast.expr) -> bool:
    """``config.engine`` and ``cfg.engine`` are the config's Engine section (its socket),
    not the client."""
    return (isinstance(node, ast.Name) and node.id in ("config", "cfg")) or (
        isinstance(node, ast.Attribute) and node.attr == "config"
    )


def test_the_adapters_reach_neither_the_engine_client_nor_the_ledger():
    wrong = []
    for name, path in MODULES.items():
        if name.split(".")[0] not in ADAPTERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("engine", "ledger")
                and not _on_config(node.value)
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and node.module in (
                "allocator.host.engine",
                "allocator.host.ledger",
            ):
                held = [a.name for a in node.names if not a.name.endswith("Error")]
                if held:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {held}")
    assert wrong == []


def test_the_walk_sees_the_imports_it_judges():
    """The checks above would pass on a walk that found nothing."""
    assert ("allocator.service.views.gpus", True) in imports("shim.serve")
    assert ("shim.serve", False) in imports("allocator.ops.cli")
    lineup = {target for target, _ in imports("allocator.service.lineup")}
    assert "allocator.core.rules.queue" in lineup
    assert "allocator.service.wiring" not in lineup  # under TYPE_CHECKING only
