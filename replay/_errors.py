"""The error a reader raises rather than return a wrong state."""

from __future__ import annotations

__all__ = ["InconsistentLog"]


class InconsistentLog(Exception):
    """The log contradicts itself: a lost, altered or foreign record.

    ``domain_id``, ``epoch_seq`` and ``cell`` say where (each may be ``None`` when the
    problem is not tied to one). Nothing from the quiescent interval at fault was
    applied: the reader's state is still the last verified quiescence point.
    """

    def __init__(self, message: str, *, domain_id: int | None = None,
                 epoch_seq: int | None = None, cell: object = None) -> None:
        where = []
        if domain_id is not None:
            where.append(f"domain {domain_id:016x}")
        if epoch_seq is not None:
            where.append(f"epoch {epoch_seq}")
        if cell is not None:
            where.append(f"cell {cell!r}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.domain_id = domain_id
        self.epoch_seq = epoch_seq
        self.cell = cell
