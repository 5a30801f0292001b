"""Commit points kept per run of changesets (``replay._commit_points``) against the way
they were kept before: one (changeset, offsets, position token) per changeset, in a
bounded deque, made when the changeset was handed out."""

from __future__ import annotations

from collections import deque
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import replay._commit_points as commit_points
from replay import Frontier, Position
from replay._commit_points import CommitPoints

_BOUND = 9


class _Changeset:
    """What a commit point reads of a changeset: its domain and position."""

    def __init__(self, domain: int, seq: int) -> None:
        self.domain_id = domain
        self.position = Position(domain, seq, seq * 16)


class _Reference:
    """The deque of points as ``KafkaLog`` kept it before runs."""

    def __init__(self) -> None:
        self.points: deque[tuple[Any, dict[int, int], str]] = deque(maxlen=_BOUND)
        self.handed: dict[int, Any] = {}

    def add_run(self, changesets: list[Any], before: dict[int, int],
                last: dict[int, int]) -> None:
        for changeset in changesets:
            self.handed[changeset.domain_id] = changeset
            token = str(Frontier.of(c.position for c in self.handed.values()))
            self.points.append((changeset, last if changeset is changesets[-1] else before,
                                token))

    def pop_through(self, through: Any) -> tuple[dict[int, int], str] | None:
        if through is not None and all(c is not through for c, _o, _t in self.points):
            return None
        point = None
        while self.points:
            changeset, offsets, token = self.points.popleft()
            point = (offsets, token)
            if changeset is through:
                break
        return point

    def drop(self, changesets: list[Any]) -> None:
        gone = {id(c) for c in changesets}
        self.points = deque((p for p in self.points if id(p[0]) not in gone),
                            maxlen=_BOUND)


_STEP = st.one_of(
    st.tuples(st.just("run"), st.lists(st.integers(1, 3), min_size=1, max_size=6)),
    st.tuples(st.just("pop"), st.integers(-2, 12)),
    st.tuples(st.just("drop"), st.lists(st.integers(0, 12), max_size=4)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_STEP, max_size=25))
def test_points_kept_per_run_equal_one_per_changeset(steps: list[Any]) -> None:
    """Any mix of runs handed out, commits (through a kept, an unknown or no changeset),
    points dropped for hidden changesets and the bound: the same points, offsets and
    tokens as one entry per changeset."""
    with mock.patch.object(commit_points, "MAX_POINTS", _BOUND):
        points, reference = CommitPoints(), _Reference()
        seq = 0
        made: list[Any] = []  # every changeset handed out (some no longer kept)
        for kind, arg in steps:
            if kind == "run":
                changesets = []
                for domain in arg:
                    seq += 1
                    changesets.append(_Changeset(domain, seq))
                made += changesets
                before, last = {0: seq * 10, 1: seq}, {0: seq * 10 + 5, 1: seq + 1}
                points.add_run(changesets, before, last,  # type: ignore[arg-type]
                               dict(reference.handed))
                reference.add_run(changesets, before, last)
            elif kind == "pop":
                through = None if arg < 0 or not made else made[arg % len(made)]
                if arg == -2:
                    through = _Changeset(1, 0)  # never handed out
                got = points.pop_through(through)  # type: ignore[arg-type]
                expected = reference.pop_through(through)
                assert (None if got is None else (got.offsets, got.token)) == expected
            else:
                hidden = [made[i % len(made)] for i in arg] if made else []
                points.drop(hidden)  # type: ignore[arg-type]
                reference.drop(hidden)
            assert [(c, p.offsets, p.token) for c, p in points] == list(reference.points)
            assert len(points) == len(reference.points)
            assert all(points.knows(c) == any(c is r for r, _o, _t in reference.points)
                       for c in made)
