"""setsum: an associative, commutative multiset hash (byte-compatible with wal3's).

Each item is hashed with SHA3-256; the digest is read as 8 little-endian u32 lanes,
and lane i is added modulo its own prime. Adding, removing, union and difference are
O(1) whatever the size of the sets, and the order of insertion does not matter. The
digest is the 8 lanes as little-endian u32 bytes; ``hexdigest`` is its lowercase hex.
Vectors: ``shared/fixtures/setsum/vectors.json``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from typing import Final

import numpy as np

__all__ = ["SETSUM_PRIMES", "Setsum"]

SETSUM_PRIMES: Final = (
    4294967291, 4294967279, 4294967231, 4294967197,
    4294967189, 4294967161, 4294967143, 4294967111,
)
_PRIMES_NP: Final = np.array(SETSUM_PRIMES, dtype=np.uint64)
_LANES: Final = struct.Struct("<8I")
_sha3 = hashlib.sha3_256
# Rows summed at once in uint64 before reducing: 2**31 lanes of < 2**32 cannot overflow.
_CHUNK_ROWS: Final = 1 << 20


class Setsum:
    """A multiset digest. ``insert``/``remove`` items; ``+``/``-`` combine digests."""

    __slots__ = ("_lanes",)

    def __init__(self, lanes: Iterable[int] = (0,) * 8) -> None:
        values = tuple(lanes)
        if len(values) != 8:
            raise ValueError(f"a setsum has 8 lanes, got {len(values)}")
        self._lanes = tuple(v % p for v, p in zip(values, SETSUM_PRIMES, strict=True))

    # -- construction ----------------------------------------------------------------

    @classmethod
    def from_digest(cls, digest: bytes) -> Setsum:
        if len(digest) != 32:
            raise ValueError(f"a setsum digest is 32 bytes, got {len(digest)}")
        return cls(_LANES.unpack(digest))

    @classmethod
    def from_hexdigest(cls, text: str) -> Setsum:
        try:
            raw = bytes.fromhex(text)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"setsum hexdigest {text!r:.80} is not hexadecimal") from exc
        if len(raw) != 32:
            raise ValueError(f"setsum hexdigest {text!r:.80} is not 64 hex digits")
        return cls.from_digest(raw)

    @classmethod
    def of(cls, items: Iterable[bytes]) -> Setsum:
        """The setsum of ``items``, hashing each one."""
        return cls().insert_digests(b"".join(_sha3(item).digest() for item in items))

    # -- mutation (returns self, so calls chain) ------------------------------------------

    def insert(self, item: bytes) -> Setsum:
        lanes = _LANES.unpack(_sha3(item).digest())
        self._lanes = tuple(
            (a + b) % p for a, b, p in zip(self._lanes, lanes, SETSUM_PRIMES, strict=True)
        )
        return self

    def remove(self, item: bytes) -> Setsum:
        lanes = _LANES.unpack(_sha3(item).digest())
        self._lanes = tuple(
            (a - b) % p for a, b, p in zip(self._lanes, lanes, SETSUM_PRIMES, strict=True)
        )
        return self

    @classmethod
    def of_digests(cls, digests: list[bytes]) -> Setsum:
        """The setsum of items given by their SHA3-256 digests."""
        if len(digests) > 16:
            return cls().insert_digests(b"".join(digests))
        # Few items: plain integers beat numpy's fixed costs.
        unpack = _LANES.unpack
        if len(digests) == 1:
            sums = unpack(digests[0])
        else:
            sums = tuple(map(sum, zip(*map(unpack, digests), strict=True)))
        setsum = cls.__new__(cls)
        setsum._lanes = tuple(v % p for v, p in zip(sums, SETSUM_PRIMES, strict=True))
        return setsum

    def insert_digests(self, digests: bytes | memoryview) -> Setsum:
        """Insert items given by their SHA3-256 digests, concatenated (32 bytes each)."""
        if len(digests) % 32:
            raise ValueError("digests must be a whole number of 32-byte SHA3-256 digests")
        rows = np.frombuffer(digests, dtype="<u4").reshape(-1, 8)
        total = np.array(self._lanes, dtype=np.uint64)
        for start in range(0, len(rows), _CHUNK_ROWS):
            chunk = rows[start : start + _CHUNK_ROWS].astype(np.uint64)
            total = (total + chunk.sum(axis=0, dtype=np.uint64) % _PRIMES_NP) % _PRIMES_NP
        self._lanes = tuple(int(v) for v in total)
        return self

    # -- algebra ------------------------------------------------------------------------

    def __add__(self, other: Setsum) -> Setsum:
        return Setsum(a + b for a, b in zip(self._lanes, other._lanes, strict=True))

    def __sub__(self, other: Setsum) -> Setsum:
        return Setsum(a - b for a, b in zip(self._lanes, other._lanes, strict=True))

    def __neg__(self) -> Setsum:
        return Setsum(-a for a in self._lanes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Setsum) and self._lanes == other._lanes

    def __hash__(self) -> int:
        return hash(self._lanes)

    def __bool__(self) -> bool:
        """False for the empty multiset's setsum (all lanes zero)."""
        return any(self._lanes)

    # -- output -------------------------------------------------------------------------

    @property
    def lanes(self) -> tuple[int, ...]:
        return self._lanes

    def digest(self) -> bytes:
        return _LANES.pack(*self._lanes)

    def hexdigest(self) -> str:
        return self.digest().hex()

    def __repr__(self) -> str:
        return f"Setsum({self.hexdigest()})"
