"""The sequencer stays sans-IO: importing it pulls in no driver."""

from __future__ import annotations

import subprocess
import sys

DRIVERS = ("psycopg", "confluent_kafka", "boto3", "pyarrow", "numpy")


def test_importing_sequencer_imports_no_driver() -> None:
    """A fresh interpreter imports sequencer; none of the drivers may be loaded."""
    code = (
        "import sys, sequencer\n"
        f"loaded = [m for m in {DRIVERS!r} if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_the_sequencer_reads_no_clock() -> None:
    """Sans-IO: no sequencer module imports a clock or the OS (time comes in as
    arguments), and ``MonotonicIds`` has no default clock to fall back on."""
    import ast
    from pathlib import Path

    import pytest

    from sequencer import MonotonicIds

    for path in Path(__file__).parents[2].joinpath("sequencer").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import | ast.ImportFrom)
                    for alias in (node.names if isinstance(node, ast.Import)
                                  else [ast.alias(node.module or "")])}
        assert not imported & {"time", "datetime", "os", "socket"}, path.name
    with pytest.raises(TypeError):
        MonotonicIds()  # type: ignore[call-arg]
