"""The packages import one another only as their ``__init__`` docstrings allow, and only
through public modules: walks every module's AST, function-level imports included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "replay", "sequencer", "sinks")
# Which other packages each may import (from the opening comment of its __init__).
MAY_IMPORT = {
    "sequencer": set(),
    "sinks": {"sequencer"},
    "replay": {"sequencer", "sinks"},
    "agent": {"sequencer", "sinks"},  # and replay at the entry points (below)
}
ENTRY_POINTS_MAY_IMPORT = {"replay"}  # agent's demo and command line


def entry_point(path: Path) -> bool:
    return path.name == "cli.py" or path.name.startswith(("_cli_", "_demo"))


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import, each imported name included
    (``from a.b import c`` gives ``a.b`` and ``a.b.c``: ``c`` may be a module)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def violations(path: Path, package: str, tree: ast.AST) -> list[str]:
    """What ``path`` (in ``package``) imports against the rules."""
    allowed = MAY_IMPORT[package] | (
        ENTRY_POINTS_MAY_IMPORT if package == "agent" and entry_point(path) else set())
    found = []
    for line, name in imported_modules(tree):
        parts = name.split(".")
        top = parts[0]
        if top not in PACKAGES or top == package:
            continue
        where = f"{path.relative_to(ROOT)}:{line}: {name}"
        if top not in allowed:
            found.append(f"{where} ({package} may not import {top})")
        elif any(part.startswith("_") for part in parts[1:]):
            found.append(f"{where} (a private module of another package)")
    return found


def scan(root: Path = ROOT) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found += violations(path, package, ast.parse(path.read_text(), str(path)))
    return found


def test_no_package_imports_another_ones_private_modules_or_breaks_its_layer() -> None:
    """Every cross-package import goes through a public module and follows the layers
    (sequencer < sinks < replay, agent; agent's demo and command line may use replay;
    bench and tests are exempt: they measure and test internals on purpose)."""
    found = scan()
    assert not found, "imports against the package rules:\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_violation() -> None:
    """A private module across packages (top-level or inside a function), a layer broken
    (sinks importing agent), and the entry points' exception: the checker is not blind."""
    cases = {
        "from sinks._setsum import Setsum\n": ("replay", True),
        "def f():\n    import sinks.kafka._driver\n": ("replay", True),
        "from sinks.kafka import _driver\n": ("replay", True),
        "from agent import Agent\n": ("sinks", True),
        "from replay import Assembler\n": ("agent", True),
        "from sinks import Setsum\nfrom sinks.codec import decode\n": ("replay", False),
        "from replay._assembler import Assembler\n": ("replay", False),  # its own package
    }
    for source, (package, bad) in cases.items():
        got = violations(ROOT / package / "_x.py", package, ast.parse(source))
        assert bool(got) == bad, (source, got)
    for name in ("_demo_x.py", "_cli_x.py", "cli.py"):
        assert violations(ROOT / "agent" / name, "agent",
                          ast.parse("from replay import PostgresReplica\n")) == []
    assert violations(ROOT / "agent" / "_cli_x.py", "agent",
                      ast.parse("from replay._assembler import Assembler\n"))
