"""Which connection a PostgreSQL call gets, sans-IO: the pool's bookkeeping, once.

``PoolSlots`` holds at most ``size`` connections (idle or lent), hands idle ones out
first, reserves a slot before a new connection is made, drops connections that are not
fit to be reused (closed, broken, or left inside a transaction) and refuses calls once
closed. It never connects, closes or waits: the store's drivers (``_Pool`` for threads,
``_AsyncPool`` for asyncio in ``agent._postgres_store``) do that, and wait where
``take`` says ``WAIT``, until a connection comes back or a slot frees.

    take()           an idle entry; CONNECT (a slot is now reserved: make one, then
                     ``connected`` or ``failed``); or WAIT (every slot is lent)
    give_back(e, fit) True: kept for reuse; False: the caller closes it (slot freed)
    shut()           refuse calls from now on; returns the idle entries to close

``take_idle`` pops an idle entry and touches nothing else, so the threaded driver calls
it without its lock (``list.pop`` and ``list.append`` are atomic); every other method
runs under the driver's lock.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from agent._postgres_spec import PostgresError

__all__ = ["CONNECT", "WAIT", "PoolSlots"]

E = TypeVar("E")


class _Verdict:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


CONNECT: Final = _Verdict("CONNECT")
WAIT: Final = _Verdict("WAIT")


class PoolSlots(Generic[E]):
    """At most ``size`` connections, idle ones reused; see the module docstring."""

    __slots__ = ("closed", "idle", "lent_or_idle", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"pool_size={size}: a PostgreSQL store needs at least one "
                             "connection")
        self.size = size
        self.idle: list[E] = []
        self.lent_or_idle = 0  # connections in existence, or being made
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise PostgresError("the PostgreSQL store is closed; create a new one")

    def take_idle(self) -> E | None:
        """An idle entry, or ``None`` (no lock needed: one atomic ``list.pop``)."""
        self._check_open()
        try:
            return self.idle.pop()
        except IndexError:
            return None

    def take(self) -> E | _Verdict:
        """An idle entry, ``CONNECT`` (a slot reserved for a new one) or ``WAIT``."""
        self._check_open()
        if self.idle:
            return self.idle.pop()
        if self.lent_or_idle < self.size:
            self.lent_or_idle += 1
            return CONNECT
        return WAIT

    def failed(self) -> None:
        """Making the connection ``take`` reserved a slot for failed: free the slot."""
        self.lent_or_idle -= 1

    def keep(self, entry: E, fit: bool) -> bool:
        """Keep a returned entry for reuse if it is ``fit`` and the pool open (atomic:
        no lock needed); ``False``: the caller closes it, then calls ``forget``."""
        if fit and not self.closed:
            self.idle.append(entry)
            return True
        return False

    def forget(self) -> None:
        """A connection was closed for good: its slot is free."""
        self.lent_or_idle -= 1

    def give_back(self, entry: E, fit: bool) -> bool:
        """``keep``, and ``forget`` when not kept (for a driver that holds its lock)."""
        if self.keep(entry, fit):
            return True
        self.forget()
        return False

    def shut(self) -> list[E]:
        """Refuse calls from now on; the idle entries, for the caller to close."""
        self.closed = True
        idle, self.idle = self.idle, []
        self.lent_or_idle -= len(idle)
        return idle
