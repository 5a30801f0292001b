"""Position tokens: where a consumer stands in a domain's log (seed 003).

A position says "every epoch of this domain up to quiescence point Q is applied".
Like Couchbase Sync Gateway's public sequence ids, it may carry a suffix naming which
later epochs were already seen complete, so a consumer can tell at once whether a log
has anything new for it. Text form, all numbers lowercase hex:

    <domain_id>:<epoch_seq>:<end_id>[+<seen>]

``end_id`` is the end of epoch Q: events of batches before it are applied. Bit i of
``seen`` stands for epoch Q+1+i, for at most ``SEEN_BITS`` (64) epochs, so ``seen`` has
at most 16 hex digits: a token is small, and parsing one is cheap whatever it holds.
A ``Frontier`` (several domains: a partially ordered time, seed 004) is the positions
joined by ``,``, sorted by domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["SEEN_BITS", "Frontier", "InvalidPosition", "Position"]

SEEN_BITS: Final = 64  # epochs after Q a token's "seen" suffix can name
_TOKEN = re.compile(r"([0-9a-f]{1,16}):([0-9a-f]{1,16}):([0-9a-f]{1,16})(?:\+([0-9a-f]+))?\Z")


class InvalidPosition(ValueError):
    """A position token that does not parse."""


@dataclass(frozen=True, slots=True)
class Position:
    """Everything up to quiescence point ``epoch_seq`` (ending at ``end_id``) is applied."""

    domain_id: int
    epoch_seq: int
    end_id: int
    seen: int = 0  # bit i: epoch epoch_seq + 1 + i seen complete, not yet applicable

    def __post_init__(self) -> None:
        if not 0 <= self.seen < 1 << SEEN_BITS:
            raise InvalidPosition(
                f"a position's seen set covers at most {SEEN_BITS} epochs "
                f"(0 <= seen < 2**{SEEN_BITS}); got {self.seen.bit_length()} bits")

    @classmethod
    def parse(cls, text: str) -> Position:
        match = _TOKEN.match(text.strip().lower())
        if match is None:
            raise InvalidPosition(
                f"position token {text!r:.80} is not of the form "
                "<domain hex>:<epoch hex>:<end id hex>[+<seen hex>]")
        domain, epoch, end, seen = match.groups()
        if seen is not None and len(seen) > SEEN_BITS // 4:
            raise InvalidPosition(
                f"position token {text!r:.80}: the +seen suffix has {len(seen)} hex digits; "
                f"it names at most {SEEN_BITS} epochs ({SEEN_BITS // 4} hex digits)")
        return cls(int(domain, 16), int(epoch, 16), int(end, 16), int(seen or "0", 16))

    def __str__(self) -> str:
        text = f"{self.domain_id:x}:{self.epoch_seq:x}:{self.end_id:x}"
        return f"{text}+{self.seen:x}" if self.seen else text

    def seen_epochs(self) -> list[int]:
        """The epochs after ``epoch_seq`` already seen complete."""
        bits = f"{self.seen:b}"[::-1]  # one pass: no shift of a big int per bit
        return [self.epoch_seq + 1 + i for i, bit in enumerate(bits) if bit == "1"]

    def covers(self, other: Position) -> bool:
        """True if this position is at or past ``other`` (same domain)."""
        return self.domain_id == other.domain_id and self.epoch_seq >= other.epoch_seq


@dataclass(frozen=True, slots=True)
class Frontier:
    """One position per domain."""

    positions: Mapping[int, Position]

    @classmethod
    def parse(cls, text: str) -> Frontier:
        positions = [Position.parse(part) for part in text.split(",") if part.strip()]
        by_domain = {p.domain_id: p for p in positions}
        if len(by_domain) != len(positions):
            raise InvalidPosition(f"frontier {text!r:.80} names a domain twice")
        return cls(by_domain)

    @classmethod
    def of(cls, positions: Iterable[Position]) -> Frontier:
        return cls({p.domain_id: p for p in positions})

    def __str__(self) -> str:
        return ",".join(str(self.positions[d]) for d in sorted(self.positions))

    def __iter__(self) -> Iterator[Position]:
        return iter(self.positions[d] for d in sorted(self.positions))

    def get(self, domain_id: int) -> Position | None:
        return self.positions.get(domain_id)

    def advanced(self, position: Position) -> Frontier:
        return Frontier({**self.positions, position.domain_id: position})
