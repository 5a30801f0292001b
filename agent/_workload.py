"""A random write workload: writer threads running overlapping write batches.

Used by ``cdc-agent demo`` and by the consistency tests. Every kind of write the
Agent offers appears: batched sets, updates, conditional stores that race and fail,
row clears, deletes, nested batches and automatic batches. Cells overlap heavily.
"""

from __future__ import annotations

import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sequencer import Value

__all__ = ["Workload", "random_value"]

_NAN_WITH_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]
_SPECIAL_VALUES: tuple[Value, ...] = (
    None, True, False, 0, -1, (1 << 63) - 1, -(1 << 63), 0.0, -0.0, float("inf"),
    _NAN_WITH_PAYLOAD, "", "π", b"", b"\x00\xff",
)


def random_value(rng: random.Random) -> Value:
    """A value of any supported type, with a bias towards the awkward ones."""
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(_SPECIAL_VALUES)
    if kind == 1:
        return rng.randrange(-(1 << 63), 1 << 63)
    if kind == 2:
        bits_: float = struct.unpack("<d", rng.randbytes(8))[0]  # any bits, NaNs included
        return bits_
    if kind == 3:
        return "".join(rng.choice("abcé字") for _ in range(rng.randrange(6)))
    if kind == 4:
        return rng.randbytes(rng.randrange(6))
    if kind == 5:
        return rng.random() < 0.5
    return rng.randrange(100)


@dataclass
class Workload:
    """``threads`` writers, each running ``batches`` random write batches on a few cells."""

    threads: int = 8
    batches: int = 1000
    tables: tuple[str, ...] = ("crashes", "issues")
    rows: tuple[int | str, ...] = (1, 2, 3, "k")
    columns: tuple[str, ...] = ("a", "b", "c")
    seed: int = 0

    def run(self, agent: object) -> None:
        """Run every writer to completion; re-raise the first writer error."""
        errors: list[BaseException] = []
        workers = [
            threading.Thread(target=self._writer, args=(agent, random.Random(self.seed * 1000 + i),
                                                          errors), name=f"writer-{i}")
            for i in range(self.threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]

    def _writer(self, agent: object, rng: random.Random, errors: list[BaseException]) -> None:
        try:
            ops = self.operations(agent, rng)
            for _ in range(self.batches):
                rng.choice(ops)()
        except BaseException as exc:  # reported by run()
            errors.append(exc)

    def operations(self, agent: object, rng: random.Random) -> list[Callable[[], None]]:
        """The writes one writer picks from (a subclass may offer others)."""
        a = agent  # an Agent; typed loosely so other agents (e.g. Postgres demos) fit
        t, r, c = self.tables, self.rows, self.columns

        def cell() -> tuple[str, int | str, str]:
            return rng.choice(t), rng.choice(r), rng.choice(c)

        def batch_of_sets() -> None:
            with a.batch():  # type: ignore[attr-defined]
                for _ in range(rng.randrange(1, 6)):
                    a.set(*cell(), random_value(rng))  # type: ignore[attr-defined]

        def auto_set() -> None:
            a.set(*cell(), random_value(rng))  # type: ignore[attr-defined]

        def update() -> None:
            a.update(rng.choice(t), rng.sample(r, rng.randrange(1, len(r))),  # type: ignore[attr-defined]
                     {rng.choice(c): random_value(rng)})

        def conditional() -> None:
            table, row, column = cell()
            seen = a.get(table, row, column)  # type: ignore[attr-defined]
            other = rng.choice(r)
            a.conditional_set(table, {  # type: ignore[attr-defined]
                row: {column: (seen, random_value(rng))},
                other: {rng.choice(c): (random_value(rng), random_value(rng))},
            })

        def clear() -> None:
            a.clear_row(rng.choice(t), rng.choice(r))  # type: ignore[attr-defined]

        def delete() -> None:
            a.delete(*cell())  # type: ignore[attr-defined]

        def nested() -> None:
            with a.batch():  # type: ignore[attr-defined]
                a.set(*cell(), random_value(rng))  # type: ignore[attr-defined]
                with a.batch():  # type: ignore[attr-defined]
                    a.delete(*cell())  # type: ignore[attr-defined]
                a.clear_row(rng.choice(t), rng.choice(r))  # type: ignore[attr-defined]

        return [batch_of_sets, batch_of_sets, auto_set, update, conditional, clear, delete,
                nested]

