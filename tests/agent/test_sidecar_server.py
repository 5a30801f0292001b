"""The sidecar server with clients as threads: capture, bad requests, orphans, shutdown."""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent import ABSENT, AgentClosed, InvalidWrite, MemoryStore
from agent.sidecar import SidecarAddressInUse, SidecarClient, SidecarError
from agent.sidecar._server import DEFAULT_MAX_QUIESCENCE_INTERVAL
from tests.agent._sidecar import Raw, Served, short_dir
from tests.helpers import bits


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _value(rng: random.Random) -> object:
    kind = rng.randrange(7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randrange(-(1 << 63), 1 << 63)
    if kind == 3:  # any 64-bit pattern: NaN payloads, -0.0, infinities
        return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
    if kind == 4:
        return "".join(rng.choice("aé€\U0001f600\x00") for _ in range(rng.randrange(4)))
    return rng.randbytes(rng.randrange(5))


def _writer(client: SidecarClient, seed: int, batches: int) -> None:
    rng = random.Random(seed)
    rows: list[Any] = [0, 1, 2, "r3", -(1 << 63)]
    columns = ["a", "b", "c"]
    for _ in range(batches):
        shape = rng.randrange(4)
        if shape == 0:  # unscoped: an automatic batch per write
            client.set("t", rng.choice(rows), rng.choice(columns), _value(rng))  # type: ignore[arg-type]
            continue
        with client.batch():
            for _ in range(rng.randrange(1, 5)):
                op = rng.randrange(6)
                row, column = rng.choice(rows), rng.choice(columns)
                if op == 0:
                    client.delete("t", row, column)
                elif op == 1:
                    client.clear_row("u", row)
                elif op == 2:
                    client.update("u", rng.sample(rows, 2), {column: _value(rng)})  # type: ignore[dict-item]
                elif op == 3:
                    current = client.get("t", row, column)
                    client.conditional_set("t", {row: {column: (current, _value(rng))}})  # type: ignore[dict-item]
                elif op == 4:
                    with client.batch():  # nested: joins the outer batch
                        client.set("u", row, column, _value(rng))  # type: ignore[arg-type]
                else:
                    client.set("t", row, column, _value(rng))  # type: ignore[arg-type]


def test_threads_on_a_shared_store_replay_to_every_quiescent_state(folder: Path) -> None:
    """Six threads write overlapping cells through the sidecar; every quiescent snapshot
    the log replays to equals the shared store's state at that point, and at the end."""
    served = Served(folder / "s")  # the sidecar's default forced quiescence: points
    client = SidecarClient(str(folder / "s"), served.store)
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            _writer(client, seed, 200)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    client.flush()
    client.close()
    served.stop()
    assert served.check_against_store() > 1
    assert served.sink.closed
    assert not (folder / "s").exists()


def test_sustained_load_still_reaches_quiescence_by_default(folder: Path) -> None:
    """Two connections whose batches overlap without end never quiesce by chance; with
    no option given, forced quiescence holds the next open once the default interval
    has passed, until the open batch closes: a quiescence point."""
    now = [0]
    served = Served(folder / "s", clock_ns=lambda: now[0])
    a, b = Raw(folder / "s"), Raw(folder / "s")
    held = {"a": a.open(), "b": b.open()}
    for step in range(6):  # each connection closes and reopens while the other is open
        raw, name = (a, "a") if step % 2 == 0 else (b, "b")
        assert raw.call({"op": "close", "batch": held[name]})["ok"]
        held[name] = raw.open()
    assert not served.at_quiescence
    now[0] = int(DEFAULT_MAX_QUIESCENCE_INTERVAL * 1e9) + 1
    a.call({"op": "close", "batch": held["a"]})
    a.send({"op": "open"})  # held back: b's batch is still open
    assert not served.quiesced.wait(0.2)
    b.call({"op": "close", "batch": held["b"]})
    assert served.quiesced.wait(10)  # b's close drained the sequencer
    assert a.reply()["ok"]  # and a's open went through after the point
    a.close()
    b.close()
    served.stop()
    assert served.check_against_store() == 2


def test_client_api_matches_the_agent(folder: Path) -> None:
    """set/delete return old values, bad writes are refused before the store is touched."""
    served = Served(folder / "s")
    with SidecarClient(str(folder / "s"), served.store) as client:
        assert client.set("t", 1, "a", "x") is ABSENT
        assert client.set("t", 1, "a", -0.0) == "x"
        assert client.delete("t", 1, "a") == 0.0
        assert client.delete("t", 1, "a") is ABSENT  # nothing there: no event
        client.set("t", 1, "a", "kept")
        with pytest.raises(InvalidWrite, match="has type list"):
            client.set("t", 1, "a", [1])  # type: ignore[arg-type]
        with pytest.raises(InvalidWrite, match="table name"):
            client.update("bad name", [1], {"a": 1})
        assert client.conditional_set("t", {1: {"a": ("kept", b"\x00")}, 2: {"a": (1, 2)}}) == {
            1: True, 2: False}
        with client.batch(), client.batch():
            client.update("t", [5, 6], {"b": True})
        assert client.clear_row("t", 5) == {"b": True}
    served.stop()
    assert served.store.snapshot() == {("t", 1, "a"): b"\x00", ("t", 6, "b"): True}
    assert len(served.sink.events) == 8
    served.check_against_store()


def test_bad_requests_get_errors_and_the_connection_keeps_working(folder: Path) -> None:
    """Malformed JSON, unknown ops, bad values and unknown batches each get an error reply;
    the connection and its open batch keep working and nothing accepted is lost."""
    served = Served(folder / "s")
    early = Raw(folder / "s", hello=False)
    assert early.call({"op": "open"})["error"] == "hello_required"
    assert early.call({"op": "hello", "protocol": 99})["error"] == "unsupported_protocol"
    early.close()

    raw = Raw(folder / "s")
    batch = raw.open()
    event = ["t", 1, "a", {"absent": True}, {"f64": "7ff8000000000001"}]
    assert raw.call({"op": "events", "batch": batch, "events": [event]}) == {
        "id": None, "ok": True, "events": 1}
    bad: list[tuple[bytes | dict[str, Any], str]] = [
        (b"{\"op\": \"events\", \n", "bad_json"),
        (b"\xff\n", "bad_json"),
        ({"op": "commit", "id": 4}, "unknown_op"),
        ({"op": "events", "batch": batch, "events": [["t", 2, "a", None, 1],
                                                     ["t", 2, "b", None, 2.5]]}, "bad_value"),
        ({"op": "events", "batch": batch, "events": [["t t", 2, "a", None, 1]]},
         "invalid_write"),
        ({"op": "events", "batch": "0000000000000001", "events": []}, "unknown_batch"),
        ({"op": "close", "batch": 12}, "bad_request"),
    ]
    for line, code in bad:
        reply = raw.call(line)
        assert reply["ok"] is False and reply["error"] == code, reply
        assert reply["message"]
    assert raw.call({"op": "commit", "id": 4})["id"] == 4
    # The batch survived every refusal, with exactly the one accepted event.
    assert raw.call({"op": "events", "batch": batch, "events": [["t", 2, "a", {"absent": True}, {
        "int": "-9223372036854775808"}]]})["events"] == 2
    other = Raw(folder / "s")  # another connection cannot touch this batch
    assert other.call({"op": "close", "batch": batch})["error"] == "unknown_batch"
    assert raw.call({"op": "close", "batch": batch}) == {"id": None, "ok": True, "events": 2}
    assert raw.call({"op": "close", "batch": batch})["error"] == "unknown_batch"
    assert raw.call({"op": "ping", "id": "p"}) == {"id": "p", "ok": True}
    assert raw.call({"op": "flush"})["ok"]
    raw.close()
    other.close()
    served.stop()
    [snap] = served.replay()
    assert bits(snap.state) == bits({("t", 1, "a"): struct.unpack(
        ">d", bytes.fromhex("7ff8000000000001"))[0], ("t", 2, "a"): -(1 << 63)})


def test_a_client_that_disconnects_mid_batch_has_its_batches_closed(folder: Path) -> None:
    """Open batches of a vanished client are closed with a warning naming them; their
    events are in the log, and the sequencer is not wedged."""
    now = [0]
    served = Served(folder / "s", clock_ns=lambda: now[0], max_quiescence_interval=1.0,
                    quiescence_wait_timeout=30.0)
    raw = Raw(folder / "s")
    first, second = raw.open(), raw.open()
    now[0] = 10**10  # ten seconds later: forced quiescence holds new batches back
    raw.call({"op": "events", "batch": first, "events": [["t", 1, "a", {"absent": True}, 1]]})
    raw.call({"op": "events", "batch": second, "events": [["t", 2, "a", {"absent": True}, 2]]})
    served.store.exchange("t", 1, "a", 1)
    served.store.exchange("t", 2, "a", 2)
    served.quiesced.clear()
    with structlog.testing.capture_logs() as logs:
        raw.close()
        assert served.quiesced.wait(30), "the orphaned batches were not closed"
        Raw(folder / "s").close()  # a round trip: the sidecar finished with that client
    [warning] = [e for e in logs if e["event"] == "cdc.sidecar_closed_orphaned_batches"]
    assert warning["batches"] == sorted([first, second])
    assert warning["log_level"] == "warning" and warning["events"] == 2
    # Forced quiescence is on: a new batch could not open if those were still open.
    with SidecarClient(str(folder / "s"), served.store) as client:
        client.set("t", 3, "a", 3)
    served.stop()
    assert served.check_against_store() >= 2


def test_shutdown_refuses_new_batches_and_lets_open_ones_finish(folder: Path) -> None:
    """stop(): new batches are refused with ``closing``; an open batch may still close
    within the grace period; then the sink is closed and the socket file removed."""
    served = Served(folder / "s", grace_period=60.0)
    holder = SidecarClient(str(folder / "s"), served.store)
    other = SidecarClient(str(folder / "s"), served.store)
    scope = holder.batch()
    scope.__enter__()
    holder.set("t", 1, "a", "in flight")
    served.sidecar.stop()
    assert served.sidecar.stopping.wait(30)
    with pytest.raises(AgentClosed, match="closed"):
        other.set("t", 2, "a", "refused")  # answered once shutdown began
    assert other.get("t", 2, "a") is ABSENT  # refused before the store was touched
    holder.set("t", 1, "b", "still accepted")
    scope.__exit__(None, None, None)
    served.stop()
    holder.close()
    other.close()
    assert served.sink.closed and not (folder / "s").exists()
    assert served.check_against_store() == 1
    assert len(served.sink.events) == 2


def test_shutdown_closes_batches_left_open_after_the_grace_period(folder: Path) -> None:
    """With no grace, a batch still open at shutdown is closed by the sidecar (warning),
    its events shipped; its client then sees the connection gone."""
    served = Served(folder / "s", grace_period=0.0)
    client = SidecarClient(str(folder / "s"), served.store)
    scope = client.batch()
    scope.__enter__()
    client.set("t", 1, "a", 1)
    with structlog.testing.capture_logs() as logs:
        served.stop()
    assert [e["reason"] for e in logs if e["event"] == "cdc.sidecar_closed_orphaned_batches"
            ] == ["the sidecar is shutting down"]
    with pytest.raises(SidecarError, match="unavailable"):
        scope.__exit__(None, None, None)
    client.close()
    assert served.check_against_store() == 1


def test_a_live_socket_is_not_taken_over_but_a_stale_one_is(folder: Path) -> None:
    """A second sidecar on a live socket fails clearly; a leftover socket file is replaced."""
    served = Served(folder / "s")
    with pytest.raises(RuntimeError, match="did not start") as info:
        Served(folder / "s")
    assert isinstance(info.value.__cause__, SidecarAddressInUse)
    assert "already listens" in str(info.value.__cause__)
    served.stop()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(folder / "s"))  # a socket file nobody listens on
    stale.close()
    again = Served(folder / "s", store=MemoryStore())
    with SidecarClient(str(folder / "s"), again.store) as client:
        client.set("t", 1, "a", 1)
    again.stop()
    assert again.check_against_store() == 1


def test_an_overlong_line_ends_only_its_connection(folder: Path) -> None:
    """A line over the limit gets line_too_long and its connection (and its batches) close;
    other connections are untouched."""
    # Forced quiescence off: it would hold the second open back behind the first batch.
    served = Served(folder / "s", max_line=4096, max_quiescence_interval=None)
    raw, other = Raw(folder / "s"), Raw(folder / "s")
    batch = raw.open()
    kept = other.open()
    raw.call({"op": "events", "batch": batch, "events": [["t", 1, "a", {"absent": True}, 1]]})
    served.store.exchange("t", 1, "a", 1)
    reply = raw.call(b'{"op": "ping", "pad": "' + b"x" * 8000 + b'"}\n')
    assert reply["error"] == "line_too_long" and "4096" in reply["message"]
    assert raw.file.readline() == b""  # the sidecar closed this connection
    assert other.call({"op": "close", "batch": kept})["ok"]
    raw.close()
    other.close()
    served.stop()
    assert served.check_against_store() >= 1


def test_lines_before_an_overlong_one_in_the_same_read_are_answered(folder: Path) -> None:
    """A ping and a close sent in one write with an overlong line after them: both are
    answered, in order, before line_too_long ends the connection."""
    served = Served(folder / "s", max_line=1000)
    raw = Raw(folder / "s")
    batch = raw.open()
    raw.send(b'{"op": "ping", "id": 1}\n{"op": "close", "id": 2, "batch": "' + batch.encode()
             + b'"}\n{"op": "ping", "pad": "' + b"x" * 2000 + b'"}\n')
    assert [raw.reply().get("id") for _ in range(2)] == [1, 2]
    assert raw.reply()["error"] == "line_too_long"
    raw.close()
    served.stop()


def test_every_value_reaches_the_log_bit_for_bit(folder: Path) -> None:
    """Hypothesis: whatever values a client writes, the log replays them bit for bit."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tests.agent.test_sidecar_protocol import VALUES

    served = Served(folder / "s")
    client = SidecarClient(str(folder / "s"), served.store)
    counter = iter(range(1 << 30))

    @settings(max_examples=60, deadline=None)
    @given(st.lists(VALUES, min_size=1, max_size=6))
    def write(values: list[Any]) -> None:
        row = next(counter)
        with client.batch():
            for i, value in enumerate(values):
                client.set("v", row, f"c{i % 3}", value)

    try:
        write()
    finally:
        client.close()
        served.stop()
    assert served.check_against_store() >= 60


def test_the_documented_session_is_what_the_sidecar_says(folder: Path) -> None:
    """docs/sidecar.md's example session, replayed against a sidecar, gets exactly the
    documented replies (the domain and batch ids aside)."""
    import json
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sidecar.md").read_text()
    session = doc.split("### An example session", 1)[1].split("```", 2)[1]
    lines = [line for line in session.splitlines() if line[:2] in ("> ", "< ")]
    assert len(lines) == 14
    served = Served(folder / "s")
    raw = Raw(folder / "s", hello=False)
    documented_batch = real_batch = ""
    try:
        for request, expected in zip(lines[::2], lines[1::2], strict=True):
            assert request.startswith("> ") and expected.startswith("< ")
            reply = raw.call(request[2:].replace(documented_batch or "\0", real_batch)
                             .encode() + b"\n")
            want = json.loads(expected[2:])
            if "domain_id" in want:
                assert re.fullmatch(r"[0-9a-f]{16}", reply["domain_id"])
                want["domain_id"] = reply["domain_id"]
            if "batch" in want:
                documented_batch, real_batch = want["batch"], reply["batch"]
                want["batch"] = real_batch
            assert reply == want
    finally:
        raw.close()
        served.stop()
    assert len(served.sink.events) == 3


def test_pipelined_reports_keep_order_and_surface_refusals(folder: Path) -> None:
    """Writes in a batch are pipelined (more than the unread-reply bound here) and all
    reach the log; a refused pipelined request is raised by the next waited-for call."""
    served = Served(folder / "s")
    client = SidecarClient(str(folder / "s"), served.store)
    with client.batch():
        for i in range(1500):
            client.set("t", i % 7, "a", i)
    connection = client._connection()
    connection.post("events", batch="0000000000000001", events=[])
    with pytest.raises(SidecarError, match="pipelined request failed earlier") as info:
        client.ping()
    assert info.value.code == "unknown_batch"
    client.ping()  # reported once; the connection goes on
    client.close()
    served.stop()
    assert len(served.sink.events) == 1500
    assert served.check_against_store() == 1


def test_an_unexpected_failure_is_answered_and_the_connection_goes_on(folder: Path) -> None:
    """An exception inside the sidecar (here: the quiescence hook) becomes an ``internal``
    error reply, logged; the batch is closed all the same and the connection works."""
    served = Served(folder / "s")
    hook = served.sidecar._on_quiescence
    failures = [RuntimeError("hook exploded")]

    def flaky(marker: Any) -> None:
        assert hook is not None
        hook(marker)
        if failures:
            raise failures.pop()

    served.sidecar._on_quiescence = flaky
    raw = Raw(folder / "s")
    batch = raw.open()
    raw.call({"op": "events", "batch": batch, "events": [["t", 1, "a", {"absent": True}, 1]]})
    served.store.exchange("t", 1, "a", 1)
    with structlog.testing.capture_logs() as logs:
        reply = raw.call({"op": "close", "batch": batch, "id": 9})
    assert reply["error"] == "internal" and "hook exploded" in reply["message"]
    assert reply["id"] == 9
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "cdc.sidecar_internal_error"]
    assert raw.call({"op": "close", "batch": batch})["error"] == "unknown_batch"
    second = raw.open()
    assert raw.call({"op": "close", "batch": second})["ok"]
    raw.close()
    served.stop()
    assert served.check_against_store() == 2


def test_connections_of_ended_threads_are_closed(folder: Path) -> None:
    """Short-lived threads do not pile up connections: one that ended is closed when
    another thread connects."""
    served = Served(folder / "s")
    client = SidecarClient(str(folder / "s"), served.store)

    def write(row: int) -> None:
        client.set("t", row, "a", row)

    for row in range(5):
        t = threading.Thread(target=write, args=(row,))
        t.start()
        t.join()
    assert len(client._all) == 2  # the main thread's and the last thread's
    client.close()
    served.stop()
    assert served.check_against_store() == 5


def test_requests_sent_just_before_a_crash_are_not_lost(folder: Path) -> None:
    """A client dying with replies unread makes the kernel reset the connection; the
    requests it sent before dying are still taken in, in order, before its batch closes."""
    served = Served(folder / "s")
    entered, release = threading.Event(), threading.Event()
    answer = served.sidecar._answer

    def blocking(connection: Any, line: bytes) -> Any:
        if b'"block"' in line:  # hold the sidecar's loop while the client dies
            entered.set()
            release.wait(30)
        return answer(connection, line)

    served.sidecar._answer = blocking  # type: ignore[method-assign]
    victim, blocker = Raw(folder / "s"), Raw(folder / "s")
    batch = victim.open()
    victim.call({"op": "events", "batch": batch, "events": [["t", 0, "a", {"absent": True}, 0]]})
    victim.send({"op": "ping"})
    victim.sock.recv(1, socket.MSG_PEEK)  # its reply has arrived, and stays unread
    blocker.send({"op": "ping", "id": "block"})
    assert entered.wait(30)
    for row in range(1, 6):  # pipelined, then the client dies
        victim.send({"op": "events", "batch": batch,
                     "events": [["t", row, "a", {"absent": True}, row]]})
    victim.close()
    served.quiesced.clear()
    release.set()
    assert served.quiesced.wait(30)
    assert blocker.reply()["id"] == "block"
    blocker.close()
    served.stop()
    [snap] = served.replay()
    assert snap.state == {("t", row, "a"): row for row in range(6)}


def test_a_refused_pipelined_close_surfaces_at_the_next_open_without_leaking_a_batch(
        folder: Path) -> None:
    """Closes are pipelined: a refused one is raised by the next ``open``, whose batch
    (opened all the same) is closed, not left to block quiescence; ``close()`` raises a
    refusal still unread."""
    served = Served(folder / "s")
    client = SidecarClient(str(folder / "s"), served.store)
    client.set("t", 1, "a", 1)
    client._connection().post("close", batch="00000000000000ff")
    with pytest.raises(SidecarError, match="pipelined request failed earlier") as info:
        client.set("t", 2, "a", 2)
    assert info.value.code == "unknown_batch"
    assert served.store.get("t", 2, "a") is ABSENT  # refused before the store was touched
    client.ping()  # the close of the batch opened meanwhile is read here
    assert served.sidecar._open_batch_names() == []
    client.set("t", 3, "a", 3)
    client._connection().post("close", batch="00000000000000ff")
    with pytest.raises(SidecarError, match="pipelined request failed") as info:
        client.close()
    assert info.value.code == "unknown_batch"
    served.stop()
    assert [(e.row, e.new) for e in served.sink.events] == [(1, 1), (3, 3)]
    assert served.check_against_store() >= 1


def test_report_batch_sends_a_batch_s_events_with_its_close(folder: Path) -> None:
    """``report="batch"``: nothing reaches the sidecar until the close (a crash inside
    the batch would lose it), then every event does, in order, in that one batch."""
    served = Served(folder / "s")
    client = SidecarClient(str(folder / "s"), served.store, report="batch")
    with client.batch():
        for i in range(2500):  # more than one run of held events
            client.set("t", i % 5, "a", i)
        client.delete("t", 0, "a")
        client.ping()  # the sidecar has handled every request sent so far
        (batch,) = [b for c in served.sidecar._connections for b in c.batches.values()]
        received = batch.seq_start + len(batch.events)
    client.flush()
    client.close()
    served.stop()
    assert received == 2048  # two full runs of 1024; the rest came with the close
    assert [e.new for e in served.sink.events][:3] == [0, 1, 2]
    assert len(served.sink.events) == 2501
    assert len({e.batch_id for e in served.sink.events}) == 1
    assert served.check_against_store() >= 1
    with pytest.raises(ValueError, match="report="):
        SidecarClient(str(folder / "s"), served.store, report="sometimes")


def test_protocol_2_answers_only_failures_of_events_and_closes(folder: Path) -> None:
    """A version 1 client gets one reply per request, as before; a version 2 client gets
    none for a successful events or plain close, a failure's reply (its id echoed) in
    request order, and a reply to every other request."""
    served = Served(folder / "s")
    served.store.exchange("t", 1, "a", 1)  # the write the old client reports
    old = Raw(folder / "s")  # hello protocol 1
    batch = old.open()
    event = ["t", 1, "a", {"absent": True}, 1]
    assert old.call({"op": "events", "batch": batch, "events": [event]})["events"] == 1
    assert old.call({"op": "close", "batch": batch}) == {"id": None, "ok": True, "events": 1}

    new = Raw(folder / "s", hello=False)
    assert new.call({"op": "hello", "protocol": 2})["protocol"] == 2
    batch = new.open()
    served.store.exchange("t", 2, "a", 2)
    new.send({"op": "events", "batch": batch, "events": [["t", 2, "a", {"absent": True}, 2]]})
    new.send({"op": "events", "id": 7, "batch": "nope", "events": []})  # fails: answered
    new.send({"op": "close", "batch": batch})
    new.send({"op": "close", "id": 8, "batch": batch})  # closed already: answered
    new.send({"op": "ping", "id": 9})
    assert [(r["id"], r.get("error")) for r in (new.reply(), new.reply())] == [
        (7, "unknown_batch"), (8, "unknown_batch")]
    assert new.reply() == {"id": 9, "ok": True}
    assert new.call({"op": "flush"}) == {"id": None, "ok": True}
    new.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        new.reply()  # nothing else was answered
    old.close()
    new.close()
    served.stop()
    assert served.check_against_store() >= 1
    assert len(served.sink.events) == 2


def test_protocol_2_failures_reach_the_client_and_old_sidecars_still_serve_it(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client raises a posted request's failure at the next waited-for request
    (protocol 2); against a sidecar that speaks only version 1 it says hello again with
    1 and captures all the same."""
    from agent.sidecar import _protocol

    served = Served(folder / "s")
    client = SidecarClient(str(folder / "s"), served.store)
    connection = client._connection()
    assert connection.protocol == 2
    connection.post("events", batch="nope", events=[])
    with pytest.raises(SidecarError, match="unknown_batch: a pipelined request failed"):
        client.set("t", 1, "a", 1)
    client.set("t", 1, "a", 2)
    client.close()
    served.stop()

    monkeypatch.setattr(_protocol, "SUPPORTED_PROTOCOLS", (1,))  # an older sidecar
    older = Served(folder / "o")
    with SidecarClient(str(folder / "o"), older.store) as client:
        assert client._connection().protocol == 1
        with client.batch():
            client.set("t", 1, "a", 1)
            client.set("t", 2, "a", 2)
        client.flush()
    older.stop()
    assert older.check_against_store() >= 1
    assert len(older.sink.events) == 2


def test_a_request_that_waits_holds_its_connection_s_later_requests_behind_it(
        folder: Path) -> None:
    """An open held back (here by a baseline's hold) runs on its own; the requests the
    client pipelined after it wait behind it, so replies keep the request order, while
    other connections are answered meanwhile."""
    served = Served(folder / "s")
    held, other = Raw(folder / "s"), Raw(folder / "s")
    served.sidecar._begin_hold()
    try:
        held.send({"op": "open", "id": 1})
        held.send({"op": "ping", "id": 2})
        assert other.call({"op": "ping", "id": 3})["id"] == 3  # the loop is not blocked
        held.sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            held.sock.recv(1, socket.MSG_PEEK)  # neither the open nor the ping answered
        held.sock.settimeout(30)
    finally:
        served.sidecar._end_hold()
    opened = held.reply()
    assert opened["id"] == 1 and opened["ok"], opened
    assert held.reply()["id"] == 2
    assert held.call({"op": "close", "batch": opened["batch"]})["ok"]
    held.close()
    other.close()
    served.stop()
