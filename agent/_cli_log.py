"""`cdc-agent log`: not written yet."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    """Add this module's subcommands to the ``cdc-agent`` parser."""
    del subparsers
