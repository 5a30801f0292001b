"""Domain ids: one random 63-bit integer per change-capture domain (one sequencer)."""

from __future__ import annotations

import secrets

__all__ = ["new_domain_id"]


def new_domain_id() -> int:
    """A random, nonzero 63-bit domain id; collisions are left to chance (2**-63 per pair)."""
    while True:
        domain = secrets.randbits(63)
        if domain:
            return domain
