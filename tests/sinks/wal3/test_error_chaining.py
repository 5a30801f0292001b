"""wal3's error boundary keeps what the layers below knew: the cause, and whether a
failed write may still have applied."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from sequencer import EpochRecord
from sinks import SinkError
from sinks.objstore import InMemoryObjectStore, StoreUnavailable
from sinks.wal3 import LogUnavailable, Wal3Sink
from sinks.wal3._store import LogStore


def test_an_ambiguous_attempt_survives_the_retries() -> None:
    """The first attempt may have applied, the later ones plainly failed: the final
    LogUnavailable still says may_have_applied, names the operation, and is chained."""
    errors = iter([StoreUnavailable("timed out after sending", may_have_applied=True),
                   StoreUnavailable("throttled"), StoreUnavailable("throttled")])

    class Flaky(InMemoryObjectStore):
        def put(self, key: str, data: bytes) -> str:
            raise next(errors)

    log = LogStore(Flaky(), "log", retries=2, sleep=lambda _: None)
    with pytest.raises(LogUnavailable) as info:
        log.put("x", b"data")
    assert info.value.may_have_applied
    assert "PUT log/x" in str(info.value) and "may have applied" in str(info.value)
    assert isinstance(info.value.__cause__, StoreUnavailable)


def test_plain_failures_do_not_claim_an_effect() -> None:
    """Failures before the operation: may_have_applied stays false."""
    store = InMemoryObjectStore()
    store.faults.fail("put", times=None)
    log = LogStore(store, "log", retries=1, sleep=lambda _: None)
    with pytest.raises(LogUnavailable) as info:
        log.put("x", b"data")
    assert not info.value.may_have_applied


def test_a_writer_failure_reaches_the_sink_caller_chained() -> None:
    """An append that failed with a non-sink error comes out as SinkError naming the
    log, with the original error as its cause."""
    sink = Wal3Sink(InMemoryObjectStore())
    failed: Future[object] = Future()
    failed.set_exception(OSError("disk on fire"))
    sink._outstanding.append(failed)  # type: ignore[arg-type]
    with pytest.raises(SinkError) as info:
        sink.write_epoch(EpochRecord(1, 1, 0, 2, 0, True, (), "00" * 32))
    assert type(info.value) is SinkError
    assert "appending to the wal3 log" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    sink.close()
