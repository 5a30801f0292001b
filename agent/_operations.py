"""Each write operation, defined once, sans-IO: a generator of store steps.

An operation (``set_cell``, ``delete_cell``, ``clear_row``, ``update``,
``conditional_set``) does no I/O. It yields steps; a driver carries each out and sends
the result back:

    step                                        the driver does            sends back
    Exchange(table, row, column, value)         store.exchange(...)        the old value
    CompareExchange(table, row, column, e, v)   store.compare_exchange()   (swapped, old)
    ReadRow(table, row)                         store.read_row(...)        {column: value}
    Emit(event)                                 records the event          None

and the generator's return value is the operation's result. An event is emitted right
after the store step it describes took effect, so a driver that records events as they
come keeps every write that happened even when a later step raises (the store failing
part way): the driver lets the store's exception propagate and the operation is not
resumed. The checks (``InvalidWrite``) run before the first step is yielded: a driver
primes the generator with ``next()`` before it opens a batch or touches the store.

The drivers: ``run`` (threads: ``Agent``, ``SidecarClient``) and ``arun`` (asyncio:
``AsyncAgent``). The sidecar runs no operation: its client does, next to the store,
and reports the emitted events.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

from sequencer import (
    ABSENT,
    Absent,
    RowKey,
    Value,
    check_name,
    check_row,
    check_value,
    check_write,
)

__all__ = [
    "CompareExchange",
    "Emit",
    "Event",
    "Exchange",
    "METHOD",
    "Operation",
    "ReadRow",
    "Step",
    "StoreStep",
    "arun",
    "clear_row",
    "conditional_set",
    "delete_cell",
    "run",
    "set_cell",
    "update",
]

T = TypeVar("T")
Event: TypeAlias = tuple[str, RowKey, str, Value | Absent, Value | Absent]
Changes: TypeAlias = Mapping[RowKey, Mapping[str, tuple[Value | Absent, Value | Absent]]]


# A store step's fields are the arguments, in order, of the RelaxedStore method that
# carries it out (``METHOD``), so a driver calls ``getattr(store, METHOD[type(step)])(*step)``.


class Exchange(NamedTuple):
    """Store ``value`` (ABSENT deletes); the result is the value replaced."""

    table: str
    row: RowKey
    column: str
    value: Value | Absent


class CompareExchange(NamedTuple):
    """Store ``value`` if the cell holds ``expected``; the result is ``(swapped, old)``."""

    table: str
    row: RowKey
    column: str
    expected: Value | Absent
    value: Value | Absent


class ReadRow(NamedTuple):
    """The row's present cells; the result is ``{column: value}``."""

    table: str
    row: RowKey


class Emit(NamedTuple):
    """A change event to record in the batch (the store step before it took effect)."""

    event: Event


METHOD: Final[Mapping[type, str]] = {
    Exchange: "exchange", CompareExchange: "compare_exchange", ReadRow: "read_row"}

StoreStep: TypeAlias = Exchange | CompareExchange | ReadRow
Step: TypeAlias = StoreStep | Emit
Operation: TypeAlias = Generator[Step, Any, T]


# -- the operations --------------------------------------------------------------------


def set_cell(table: str, row: RowKey, column: str, value: Value) -> Operation[Value | Absent]:
    """Write one cell; return the value it replaced (ABSENT if it did not exist)."""
    check_write(table, row, column, value)
    old = yield Exchange(table, row, column, value)
    yield Emit((table, row, column, old, value))
    return old  # type: ignore[no-any-return]


def delete_cell(table: str, row: RowKey, column: str) -> Operation[Value | Absent]:
    """Remove one cell; return the value it held (ABSENT if none: no event)."""
    check_name("table", table)
    check_row(row)
    check_name("column", column)
    old = yield Exchange(table, row, column, ABSENT)
    if old is not ABSENT:  # nothing was there: nothing changed, no event
        yield Emit((table, row, column, old, ABSENT))
    return old  # type: ignore[no-any-return]


def clear_row(table: str, row: RowKey) -> Operation[dict[str, Value]]:
    """Remove every cell of a row; return the values removed."""
    check_name("table", table)
    check_row(row)
    removed: dict[str, Value] = {}
    cells: dict[str, Value] = yield ReadRow(table, row)
    for column in cells:
        old = yield Exchange(table, row, column, ABSENT)
        if old is not ABSENT:  # a racing writer may have removed it first
            removed[column] = old
            yield Emit((table, row, column, old, ABSENT))
    return removed


def check_update(table: str, rows: Iterable[RowKey],
                 values: Mapping[str, Value]) -> list[RowKey]:
    """Checks of an ``update`` (all before the store is touched); returns the rows."""
    check_name("table", table)
    checked = [check_row(r) for r in rows]
    for column, value in values.items():
        check_name("column", column)
        check_value(value)
    return checked


def update(table: str, rows: Iterable[RowKey], values: Mapping[str, Value]) -> Operation[None]:
    """Set ``values`` on every row of ``rows`` (an SQL UPDATE)."""
    checked = check_update(table, rows, values)
    for row in checked:
        for column, value in values.items():
            old = yield Exchange(table, row, column, value)
            yield Emit((table, row, column, old, value))


def check_conditional(table: str, changes: Changes) -> None:
    """Checks of a ``conditional_set`` (all before the store is touched)."""
    check_name("table", table)
    for row, cells in changes.items():
        check_row(row)
        for column, (_expected, new) in cells.items():
            check_name("column", column)
            if new is not ABSENT:
                check_value(new)


def conditional_set(table: str, changes: Changes) -> Operation[dict[RowKey, bool]]:
    """Per row, swap each cell from ``expected`` to ``new``; return per-row success.

    Each cell's swap is atomic; a row stops at its first cell that does not hold the
    expected value, and earlier cells of that row stay written (the store fails
    partially, at row granularity at best). Only swaps that happened become events, and
    a swap from ABSENT to ABSENT changed nothing: no event.
    """
    check_conditional(table, changes)
    results: dict[RowKey, bool] = {}
    for row, cells in changes.items():
        ok = True
        for column, (expected, new) in cells.items():
            swapped, old = yield CompareExchange(table, row, column, expected, new)
            if not swapped:
                ok = False
                break
            if not (old is ABSENT and new is ABSENT):
                yield Emit((table, row, column, old, new))
        results[row] = ok
    return results


# -- drivers ---------------------------------------------------------------------------


def run(store: Any, op: Operation[T], step: Step, record: Callable[[Event], object]) -> T:
    """Carry ``op`` out against a ``RelaxedStore``, from ``step`` (its first step, which
    the caller got by priming it), passing each emitted event to ``record``."""
    try:
        while True:
            if type(step) is Emit:
                record(step.event)
                step = op.send(None)
            else:
                step = op.send(getattr(store, METHOD[type(step)])(*step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(store: Any, op: Operation[T], step: Step,
               record: Callable[[Event], object]) -> T:
    """``run`` against an ``AsyncRelaxedStore`` (each store step awaited)."""
    try:
        while True:
            if type(step) is Emit:
                record(step.event)
                step = op.send(None)
            else:
                result = await getattr(store, METHOD[type(step)])(*step)
                step = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
