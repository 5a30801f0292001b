"""Where a Kafka consumer restarts after each changeset it handed out (``KafkaLog``).

Changesets are handed out in runs (one ``drain``); every changeset of a run but the last
restarts from the offsets worked out before the run (earlier than its own: a restart
from them re-reads a little and drops what its position token says was applied, it
skips nothing), the last from its exact offsets. So a run is kept as one entry (its
changesets, both offsets, the changesets handed out before it) and a changeset's
``CommitPoint`` is made only when asked for: with write batches of 1 a poll hands out
thousands of changesets, and objects made for each of them lived until the commit,
long enough for the garbage collector's full passes to walk them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Final

from replay._assembler import Changeset
from replay._position import Frontier, Position

__all__ = ["CommitPoint", "CommitPoints"]

MAX_POINTS: Final = 100_000  # changesets whose points are kept (a consumer that never
# commits keeps only the latest)


class CommitPoint:
    """Where a consumer restarts once a changeset is applied: ``offsets`` (per partition,
    the first message not yet part of a changeset handed out) and ``token`` (the
    position to resume with, formatted when first asked)."""

    __slots__ = ("_parts", "_token", "offsets")

    def __init__(self, offsets: dict[int, int], parts: Mapping[int, Changeset | Position]
                 ) -> None:
        self.offsets = offsets
        self._parts = parts
        self._token: str | None = None

    @property
    def token(self) -> str:
        if self._token is None:
            positions = (p if isinstance(p, Position) else p.position
                         for p in self._parts.values())
            self._token = str(Frontier.of(positions))
        return self._token


class _Run:
    """Changesets handed out together; ``start``: how many of them are gone (committed
    or dropped as the oldest); ``hidden``: indexes of those a rebuilding consumer hid."""

    __slots__ = ("before", "changesets", "domains", "handed", "hidden", "last", "start")

    def __init__(self, changesets: list[Changeset], before: dict[int, int],
                 last: dict[int, int], handed: dict[int, Changeset | Position]) -> None:
        self.changesets = changesets
        self.before = before  # offsets for all but the last
        self.last = last  # offsets for the last
        self.handed = handed  # per domain, the last handed out before the run
        self.start = 0
        self.hidden: set[int] | None = None
        self.domains: frozenset[int] | None = None  # of the changesets, found when needed

    def point(self, index: int) -> CommitPoint:
        """The commit point of ``changesets[index]``: the offsets and, per domain, the
        last changeset handed out up to it (hidden ones too, as when it was made).
        Looked for backwards, until every domain of the run is found: one step for a
        one-domain run, however far into it ``index`` is."""
        parts = dict(self.handed)
        if self.domains is None:
            self.domains = frozenset(c.domain_id for c in self.changesets)
        missing = set(self.domains)
        for i in range(index, -1, -1):
            changeset = self.changesets[i]
            if changeset.domain_id in missing:
                missing.discard(changeset.domain_id)
                parts[changeset.domain_id] = changeset
                if not missing:
                    break
        last = index == len(self.changesets) - 1
        return CommitPoint(self.last if last else self.before, parts)

    def kept(self) -> list[int]:
        """Indexes of the points still kept, in order."""
        hidden = self.hidden or ()
        return [i for i in range(self.start, len(self.changesets)) if i not in hidden]

    def count(self, end: int) -> int:
        """Points kept before index ``end``."""
        hidden = self.hidden
        gone = sum(1 for i in hidden if self.start <= i < end) if hidden else 0
        return max(0, end - self.start) - gone

    def last_kept(self) -> int | None:
        """The index of the last point kept (None: none is)."""
        hidden = self.hidden or ()
        for i in range(len(self.changesets) - 1, self.start - 1, -1):
            if i not in hidden:
                return i
        return None

    def index(self, changeset: Changeset) -> int | None:
        for i in range(self.start, len(self.changesets)):
            if self.changesets[i] is changeset:
                return None if self.hidden and i in self.hidden else i
        return None


class CommitPoints:
    """``(changeset, CommitPoint)`` pairs in the order handed out, kept per run; at most
    ``MAX_POINTS`` (the oldest dropped first)."""

    def __init__(self) -> None:
        self._runs: deque[_Run] = deque()
        self._count = 0  # points kept

    def add_run(self, changesets: list[Changeset], before: dict[int, int],
                last: dict[int, int], handed: dict[int, Changeset | Position]) -> None:
        """Changesets handed out together (``handed``: per domain, the last one before
        them; not copied)."""
        if not changesets:
            return
        self._runs.append(_Run(list(changesets), before, last, handed))
        self._count += len(changesets)
        if self._count > MAX_POINTS:
            self._pop_first()

    def _pop_first(self) -> None:
        """Forget the oldest points kept, down to ``MAX_POINTS``."""
        while self._count > MAX_POINTS:
            run = self._runs[0]
            kept = run.count(len(run.changesets))
            excess = self._count - MAX_POINTS
            if kept <= excess:
                self._runs.popleft()
                self._count -= kept
                continue
            end = run.start + excess  # past at least ``excess`` points kept
            while run.count(end) < excess:
                end += 1
            self._count -= run.count(end)
            run.start = end

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[Changeset, CommitPoint]]:
        for run in self._runs:
            for i in run.kept():
                yield run.changesets[i], run.point(i)

    def knows(self, changeset: Changeset) -> bool:
        """Whether ``changeset``'s point is kept."""
        return any(run.index(changeset) is not None for run in self._runs)

    def pop_through(self, through: Changeset | None) -> CommitPoint | None:
        """Remove the points up to ``through`` (default: all) and return its point; None
        if none is kept (or ``through``'s is not: then nothing is removed)."""
        if through is not None and not self.knows(through):
            return None
        point = None
        while self._runs:
            run = self._runs[0]
            found = None if through is None else run.index(through)
            stop = found if found is not None else run.last_kept()
            if stop is not None:
                point = run.point(stop)
                self._count -= run.count(stop + 1)
                run.start = stop + 1
            if run.last_kept() is None:
                self._runs.popleft()
            if found is not None:
                break
        return point

    def drop(self, changesets: list[Changeset]) -> None:
        """Forget the points of ``changesets`` (those a rebuilding consumer hides); the
        others keep theirs as they were."""
        gone = {id(c) for c in changesets}
        for run in self._runs:
            for i in run.kept():
                if id(run.changesets[i]) in gone:
                    if run.hidden is None:
                        run.hidden = set()
                    run.hidden.add(i)
                    self._count -= 1
        self._runs = deque(run for run in self._runs if run.kept())
