"""Fault, latency and crash injection for the in-memory store: the plan and its rules.

A ``FaultPlan`` is a list of rules. Each call of a store operation is shown to every
rule twice: in the ``"before"`` phase (nothing done yet) and in the ``"after"`` phase
(the operation took effect). A rule that matches acts: it raises ``StoreUnavailable``
(a transient failure; in the after phase an *ambiguous* one: the write happened but
the caller sees an error), raises ``Crash`` (a simulated process crash), or sleeps
through the injected sleep function (latency, before phase only).

Matching: ``op`` and ``key`` are ``fnmatch`` patterns (``"put*"`` is every write;
for ``list`` the key is the prefix). ``nth=3`` fires on the third matching call only;
``times`` bounds how often a rule fires (``None``: forever); ``probability`` draws from
the plan's seeded ``random.Random``, so a run is reproducible from its seed.
"""

from __future__ import annotations

import fnmatch
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sinks.objstore._errors import ObjectStoreError, StoreUnavailable

__all__ = ["Call", "Crash", "FaultPlan", "FaultRule", "Phase"]

Phase = Literal["before", "after"]
OPERATIONS = ("get", "head", "put", "put_if_absent", "put_if_match", "list", "delete")
WRITES = frozenset({"put", "put_if_absent", "put_if_match", "delete"})


class Crash(BaseException):
    """A simulated process crash, raised at a chosen step of a store operation.

    A ``BaseException``, so production code's ``except Exception`` does not swallow it:
    it unwinds to the test, as a real crash would end the process.
    """


@dataclass(frozen=True)
class Call:
    """One store operation as hooks and rules see it.

    ``n`` counts the calls of ``op`` on this store so far, this one included (from 1).
    """

    op: str
    key: str
    n: int
    phase: Phase


Action = Literal["fail", "crash", "delay"]


@dataclass
class FaultRule:
    """One rule of a ``FaultPlan`` (built by ``fail``, ``crash`` or ``delay``)."""

    action: Action
    op: str = "*"
    key: str = "*"
    phase: Phase = "before"
    nth: int | None = None
    times: int | None = 1
    probability: float = 1.0
    seconds: float = 0.0
    error: Callable[[Call], BaseException] | None = None
    matched: int = 0
    fired: int = 0

    def matches(self, call: Call) -> bool:
        return (call.phase == self.phase and fnmatch.fnmatchcase(call.op, self.op)
                and fnmatch.fnmatchcase(call.key, self.key))


@dataclass
class FaultPlan:
    """The faults a store will inject. Thread-safe; deterministic for a given ``seed``.

    Build rules with ``fail``, ``crash`` and ``delay``; ``clear`` removes them all.
    """

    seed: int = 0
    rules: list[FaultRule] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def fail(self, op: str = "*", *, key: str = "*", nth: int | None = None,
             times: int | None = 1, probability: float = 1.0, after: bool = False,
             error: Callable[[Call], BaseException] | None = None) -> FaultRule:
        """Make matching calls raise ``StoreUnavailable`` (or ``error(call)`` if given).

        ``after=False``: before the operation, nothing happens. ``after=True``: the
        operation takes effect, then the caller gets the error (``may_have_applied``).
        """
        return self._add(FaultRule("fail", op, key, "after" if after else "before", nth,
                                   times, probability, error=error))

    def crash(self, op: str = "*", *, key: str = "*", nth: int | None = None,
              after: bool = False, probability: float = 1.0) -> FaultRule:
        """Raise ``Crash`` at a matching call, before or after its effect; fires once."""
        return self._add(FaultRule("crash", op, key, "after" if after else "before", nth,
                                   1, probability))

    def delay(self, seconds: float, op: str = "*", *, key: str = "*", nth: int | None = None,
              times: int | None = None, probability: float = 1.0) -> FaultRule:
        """Call the store's ``sleep(seconds)`` before matching calls (no lock held)."""
        if seconds < 0:
            raise ValueError(f"delay must be non-negative, got {seconds}")
        return self._add(FaultRule("delay", op, key, "before", nth, times, probability,
                                   seconds=seconds))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _add(self, rule: FaultRule) -> FaultRule:
        if rule.op != "*" and not any(fnmatch.fnmatchcase(o, rule.op) for o in OPERATIONS):
            raise ValueError(f"op pattern {rule.op!r} matches no operation of {OPERATIONS}")
        if rule.nth is not None and rule.nth < 1:
            raise ValueError(f"nth counts from 1, got {rule.nth}")
        if not 0.0 <= rule.probability <= 1.0:
            raise ValueError(f"probability must be within [0, 1], got {rule.probability}")
        with self._lock:
            self.rules.append(rule)
        return rule

    def decide(self, call: Call) -> tuple[float, BaseException | None]:
        """Apply the rules to ``call``: (seconds to sleep, exception to raise or None)."""
        delay = 0.0
        with self._lock:
            for rule in self.rules:
                if not rule.matches(call):
                    continue
                rule.matched += 1
                if rule.nth is not None and rule.matched != rule.nth:
                    continue
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                    continue
                rule.fired += 1
                if rule.action == "delay":
                    delay += rule.seconds
                    continue
                return delay, self._exception(rule, call)
        return delay, None

    @staticmethod
    def _exception(rule: FaultRule, call: Call) -> BaseException:
        where = f"{call.op} {call.key!r} (call {call.n})"
        if rule.action == "crash":
            return Crash(f"injected crash {call.phase} {where}")
        if rule.error is not None:
            return rule.error(call)
        if call.phase == "after":
            applied = call.op in WRITES
            return StoreUnavailable(
                f"injected ambiguous failure after {where}: the operation took effect",
                key=call.key or None, may_have_applied=applied)
        return StoreUnavailable(f"injected failure before {where}: nothing happened",
                                key=call.key or None)


def check_error(error: BaseException) -> BaseException:
    """Reject injected errors a real backend could never raise."""
    if isinstance(error, Exception) and not isinstance(error, ObjectStoreError):
        raise TypeError(f"injected error {error!r} must be an ObjectStoreError (backends "
                        "raise nothing else) or a BaseException such as Crash")
    return error
