"""The sidecar's memory is bounded over all connections, not only per line (issue 10,
item 10): unfinished requests beyond a global budget are refused with memory_limit,
busy clients are slowed (not refused), and the bytes are given back when connections
close."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sidecar import Sidecar
from agent.sidecar import _protocol as p
from sinks import MemorySink
from tests.agent._sidecar import Raw, Served, short_dir

KIB = 1 << 10


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_unfinished_requests_beyond_the_budget_are_refused_and_released(folder: Path) -> None:
    served = Served(folder / "s", max_line=1024 * KIB, max_buffered=3000 * KIB)
    sidecar = served.sidecar
    keeper = Raw(folder / "s")
    batch = keeper.open()  # an open batch on a connection that behaves
    hogs = [Raw(folder / "s") for _ in range(8)]
    for hog in hogs:  # 8 x 900 KiB of unfinished lines: 7.2 MB against a 3 MB budget
        hog.sock.sendall(b'{"op": "events", "batch": "' + b"x" * (900 * KIB))
    refused = []
    for hog in hogs:
        hog.sock.settimeout(2)
        try:
            line = hog.file.readline()
        except TimeoutError:
            continue  # paused or still within budget: it got no reply
        if line:
            refused.append(json.loads(line))
    assert refused, "nothing was refused"
    for reply in refused:
        assert reply["ok"] is False and reply["error"] == p.MEMORY_LIMIT, reply
        assert "at most 3072000 bytes" in reply["message"]
    # The sidecar never held much more than its budget (one read per connection over).
    assert sidecar.buffered_bytes <= 3000 * KIB + 8 * 256 * KIB
    # The connection that behaves goes on, batch and all.
    assert keeper.call({"op": "events", "batch": batch, "events": [
        ["t", 1, "a", {"absent": True}, 1]]})["events"] == 1
    for hog in hogs:
        hog.close()
    _wait_for(lambda: sidecar.buffered_bytes == 0, "bytes were not given back")
    assert keeper.call({"op": "close", "batch": batch})["ok"]
    keeper.close()
    served.stop()


def test_a_client_sending_fast_is_slowed_not_refused(folder: Path) -> None:
    """Pipelined requests far beyond the budget: the sidecar pauses reading, handles
    what it holds, and goes on; every request gets its ok reply."""
    served = Served(folder / "s", max_line=256 * KIB, max_buffered=512 * KIB)
    raw = Raw(folder / "s")
    batch = raw.open()
    payload = "v" * (60 * KIB)
    count = 60  # 3.6 MB of requests, seven times the budget

    def send() -> None:
        for i in range(count):
            raw.send({"op": "events", "batch": batch, "events": [
                ["t", i, "a", {"absent": True}, payload]]})

    sender = threading.Thread(target=send)
    sender.start()
    replies = [raw.reply() for _ in range(count)]
    sender.join(60)
    assert [r.get("events") for r in replies] == list(range(1, count + 1)), replies[-1]
    assert raw.call({"op": "close", "batch": batch})["events"] == count
    raw.close()
    _wait_for(lambda: served.sidecar.buffered_bytes == 0, "bytes were not given back")
    served.stop()
    assert len(served.replay()[-1].state) == count


def test_the_budget_must_hold_one_whole_line() -> None:
    with pytest.raises(ValueError, match="max_buffered"):
        Sidecar(MemorySink(), max_line=1 << 20, max_buffered=1 << 10)


class _Reader:
    """A connection as the budget sees it."""

    def __init__(self, buffered: int, request: bool) -> None:
        self.bytes, self.request, self.paused = buffered, request, False

    def buffered(self) -> int:
        return self.bytes

    def has_request(self) -> bool:
        return self.request

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


def test_a_paused_connection_resumes_once_no_request_is_left_to_free_bytes() -> None:
    """A connection paused while another held a request, its own unfinished line over
    half the budget: once the other's request is handled and nothing else can free
    bytes, it resumes (it used to stay paused for ever, its client hanging)."""
    from agent.sidecar._server import _Budget

    budget = _Budget(100)
    busy, partial = _Reader(40, request=True), _Reader(70, request=False)
    budget.readers = {busy, partial}  # type: ignore[assignment]
    budget.used = 110
    budget.over(partial)  # type: ignore[arg-type]
    assert partial.paused and budget.paused == {partial}
    busy.request, busy.bytes = False, 0
    budget.release(40)  # 70 held: over half the limit, but only by unfinished lines
    assert not partial.paused and not budget.paused
