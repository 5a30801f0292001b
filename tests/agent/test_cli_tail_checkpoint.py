"""`cdc-agent tail wal3` on a collected or compacted log starts from its checkpoint
(issue 9): it prints the same states as on the uncompacted log, says where it started,
and refuses a `--position` the compacted log cannot continue from."""

from __future__ import annotations

import argparse
import io
import json
import shutil
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

from agent import Agent, MemoryStore
from agent._cli_tail import run_wal3
from agent._workload import Workload
from replay import collect_log, compact_log
from sinks.wal3 import CursorStore, LogReader, WriterOptions, open_log_sink


def build(tmp_path: Path, domains: int = 1) -> Path:
    log = tmp_path / "log"
    store = MemoryStore()
    for d in range(domains):
        agent = Agent(store, open_log_sink(log.as_uri(),
                                           options=WriterOptions(batch_size_records=3)))
        for seed in range(6):
            Workload(threads=2, batches=6, seed=seed * 10 + d,
                     rows=(1, 2, 3, "k")).run(agent)
            agent.flush()
        agent.close()
    return log


def tail(log: Path, position: str | None = None) -> tuple[int, list[dict[str, Any]], str]:
    args = argparse.Namespace(uri=str(log), prefix="", endpoint_url=None, position=position,
                              until_end=True, poll=1.0, verbose=False)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stderr(err):
        code = run_wal3(args, out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def key(change: dict[str, Any]) -> tuple[str, str, str]:
    return (change["table"], json.dumps(change["row"]), change["column"])


def states(lines: list[dict[str, Any]], start: dict[Any, Any] | None = None
           ) -> dict[str, dict[Any, Any]]:
    """The state after each printed position (applying each line's changes)."""
    state = dict(start or {})
    out = {}
    for line in lines:
        for change in line["changes"]:
            assert state.get(key(change), "ABSENT") == change.get("before", "ABSENT"), change
            if "after" in change:
                state[key(change)] = change["after"]
            else:
                state.pop(key(change), None)
        out[line["position"]] = dict(state)
    return out


def test_tail_of_a_collected_log_starts_from_the_checkpoint(tmp_path: Path) -> None:
    log = build(tmp_path)
    end = LogReader(log.as_uri()).manifest().next_offset
    CursorStore(log.as_uri()).init("consumer", end // 2)
    reference = tmp_path / "reference"
    shutil.copytree(log, reference)
    code, full, err = tail(reference)
    assert code == 0 and "checkpoint" not in err
    report = collect_log(log.as_uri())
    assert report.gc is not None and report.gc.applied
    assert LogReader(log.as_uri()).manifest().oldest_offset > 1
    code, lines, err = tail(log)
    assert code == 0, err
    assert "starting from its checkpoint" in err and str(end // 2) in err
    # The first line holds every cell of the checkpoint: the state the uncompacted log
    # had at that position; every later line is the uncompacted log's, bit for bit.
    first = lines[0]
    positions = [line["position"] for line in full]
    at = positions.index(first["position"])
    assert states(full)[first["position"]] == states(lines[:1])[first["position"]]
    assert lines[1:] == full[at + 1:]
    assert states(lines) == {p: s for p, s in states(full).items() if p in set(
        line["position"] for line in lines)}
    # A resume at a printed position continues exactly as on the uncompacted log.
    code, rest, _ = tail(log, lines[2]["position"])
    assert code == 0 and rest == lines[3:]
    # A position before the checkpoint is refused: its events were collected.
    code, _, err = tail(log, full[0]["position"])
    assert code == 1 and "before this log's checkpoint" in err


def test_tail_of_a_compacted_log_reaches_every_retained_state(tmp_path: Path) -> None:
    """Two domains, three cursors: the tail's states at every stripe's end are the
    uncompacted log's, and it ends with the same lines."""
    log = build(tmp_path, domains=2)
    end = LogReader(log.as_uri()).manifest().next_offset
    for i, point in enumerate((end // 4, end // 2, 3 * end // 4)):
        CursorStore(log.as_uri()).init(f"r{i}", point)
    reference = tmp_path / "reference"
    shutil.copytree(log, reference)
    _, full, _ = tail(reference)
    compact_log(log.as_uri())
    code, lines, err = tail(log)
    assert code == 0 and "starting from its checkpoint" in err
    want = states(full)
    got = states(lines)
    for position, state in got.items():
        assert want[position] == state, position
    assert lines[-5:] == full[-5:]
    # A position strictly inside a stripe is refused, naming its ends.
    inside = [line["position"] for line in full if line["position"] not in got]
    code, _, err = tail(log, inside[len(inside) // 2])
    assert code == 1 and ("inside a compacted stripe" in err or "before this log's" in err)
