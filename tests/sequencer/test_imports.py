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
