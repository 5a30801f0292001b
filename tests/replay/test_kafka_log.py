"""KafkaLog without a broker: the sink's exact messages, interleaved, duplicated, cut short
or altered, give the store's states at every quiescence point or a clear InconsistentLog."""

from __future__ import annotations

import random

import pytest

from replay import Assembler, InconsistentLog
from replay.kafka import KafkaLog
from sinks.codec import decode_native_event as decode_event
from tests.helpers import bits
from tests.sinks.kafka._simulate import Feeder, Run, apply, captured_run, simulate_topic


@pytest.fixture(scope="module")
def run() -> Run:
    """4 writer threads x 150 random batches, captured with the store at each quiescence."""
    return captured_run(seed=11)


@pytest.mark.parametrize("encoding", ["native", "debezium"])
@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_every_quiescent_state_is_the_stores(run: Run, encoding: str, partitions: int) -> None:
    """Any interleaving of partitions yields every quiescence point, each the store's state."""
    topic = simulate_topic(run.items, partitions, encoding)
    log = KafkaLog(partitions, encoding=encoding)
    state: dict = {}
    seen = []
    for changeset in Feeder(topic, random.Random(partitions)).feed(log):
        apply(state, changeset)
        assert bits(state) == run.at_quiescence[(changeset.domain_id, changeset.epoch_seq)]
        seen.append(changeset.epoch_seq)
    assert len(seen) == len(run.at_quiescence) > 0  # how many depends on the scheduler
    assert seen == sorted(seen)
    assert bits(state) == run.final
    assert log.duplicates == 0


def test_redelivered_prefix_is_dropped(run: Run) -> None:
    """Messages delivered twice (a consumer re-reading after a lost commit) change nothing."""
    topic = simulate_topic(run.items, 3, "native")
    doubled = [msgs[: len(msgs) // 2] + msgs for msgs in topic]
    log = KafkaLog(3)
    state: dict = {}
    for changeset in Feeder(doubled, random.Random(1)).feed(log):
        apply(state, changeset)
    assert bits(state) == run.final
    assert log.duplicates > 0


def _event_positions(topic):
    return [(p, i) for p, msgs in enumerate(topic) for i, (_k, v, h) in enumerate(msgs)
            if h is None]


@pytest.mark.parametrize("encoding", ["native", "debezium"])
def test_a_lost_event_is_reported_not_applied(run: Run, encoding: str) -> None:
    """Drop any one event: InconsistentLog, and no changeset at or after its epoch."""
    rng = random.Random(5)
    topic = simulate_topic(run.items, 3, encoding)
    for _ in range(5):
        p, i = rng.choice(_event_positions(topic))
        cut = [list(msgs) for msgs in topic]
        del cut[p][i]
        log = KafkaLog(3, encoding=encoding)
        with pytest.raises(InconsistentLog, match=r"lost|missing|chain"):
            Feeder(cut, random.Random(2)).feed(log)


def test_an_altered_event_is_reported(run: Run) -> None:
    """Flip one bit of one event's new value: the partition's setsum no longer matches."""
    topic = simulate_topic(run.items, 3, "native")
    p, i = next((p, i) for p, i in _event_positions(topic)
                if len(decode_event(topic[p][i][1]).new) > 2)
    key, value, headers = topic[p][i]
    topic[p][i] = (key, value[:-1] + bytes([value[-1] ^ 1]), headers)
    with pytest.raises(InconsistentLog, match="setsum"):
        Feeder(topic, random.Random(2)).feed(KafkaLog(3))


def test_a_cut_message_is_reported(run: Run) -> None:
    """A truncated event message is an InconsistentLog, not a decoding crash."""
    topic = simulate_topic(run.items, 3, "native")
    p, i = _event_positions(topic)[7]
    key, value, headers = topic[p][i]
    topic[p][i] = (key, value[:-1], headers)
    with pytest.raises(InconsistentLog, match="corrupt event message"):
        Feeder(topic, random.Random(2)).feed(KafkaLog(3))


def test_a_lost_epoch_marker_is_reported(run: Run) -> None:
    """Drop one partition's marker of one epoch: the next marker shows the gap."""
    topic = simulate_topic(run.items, 3, "native")
    markers = [i for i, (_k, _v, h) in enumerate(topic[1]) if h is not None]
    del topic[1][markers[len(markers) // 2]]
    with pytest.raises(InconsistentLog, match=r"skips from epoch|lost"):
        Feeder(topic, random.Random(2)).feed(KafkaLog(3))


def test_restart_from_commit_offsets_and_position(run: Run) -> None:
    """Stop anywhere, restart from commit_offsets() and the position: same final state,
    every quiescence point once, none applied twice."""
    topic = simulate_topic(run.items, 3, "native")
    rng = random.Random(9)
    log = KafkaLog(3)
    feeder = Feeder(topic, rng)
    state: dict = {}
    epochs = []
    total = sum(map(len, topic))
    while not epochs and sum(feeder.next) < total:  # past a first changeset, then anywhere
        for changeset in feeder.feed(log, limit=20):
            apply(state, changeset)
            epochs.append(changeset.epoch_seq)
    for changeset in feeder.feed(log, limit=rng.randrange(max(1, total - sum(feeder.next)))):
        apply(state, changeset)
        epochs.append(changeset.epoch_seq)
    assert epochs
    offsets, position = log.commit_offsets(), str(log.position)
    restarted = KafkaLog(3, assembler=Assembler(state, position=position))
    for p, offset in offsets.items():
        restarted.seek(p, offset)
    resumed = Feeder(topic, random.Random(10), next=[offsets.get(p, 0) for p in range(3)])
    for changeset in resumed.feed(restarted):
        assert all(state.get(cell) == before or bits({0: state.get(cell)}) == bits({0: before})
                   for cell, before in changeset.before.items() if cell in state)
        apply(state, changeset)
        epochs.append(changeset.epoch_seq)
        assert bits(state) == run.at_quiescence[(changeset.domain_id, changeset.epoch_seq)]
    assert len(epochs) == len(set(epochs)) == len(run.at_quiescence)
    assert bits(state) == run.final


def test_starting_mid_domain_without_a_position_is_refused(run: Run) -> None:
    """Reading from the middle of a domain with no position is an error, not a guess."""
    topic = simulate_topic(run.items, 1, "native")
    markers = [i for i, (_k, _v, h) in enumerate(topic[0]) if h is not None]
    tail = [topic[0][markers[5] + 1 :]]
    with pytest.raises(InconsistentLog, match="middle of the domain"):
        Feeder(tail, random.Random(1)).feed(KafkaLog(1))


@pytest.mark.parametrize("partitions", [1, 3])
def test_bulk_mode_equals_streaming_and_restarts_from_any_commit_point(
        run: Run, partitions: int) -> None:
    """KafkaLog(bulk=True) + drain() at random points: the same changesets as feed()
    verifying each interval at once; and a restart from any changeset's commit point
    (offsets + token) hands out exactly the changesets after it."""
    topic = simulate_topic(run.items, partitions, "native")
    streaming = [(c.epoch_seq, c._changes)
                 for c in Feeder(topic, random.Random(4)).feed(KafkaLog(partitions))]
    rng = random.Random(partitions)
    bulk = KafkaLog(partitions, bulk=True)
    feeder = Feeder(topic, random.Random(4))
    got = []
    total = sum(map(len, topic))
    while sum(feeder.next) < total:
        assert feeder.feed(bulk, limit=rng.choice([1, 5, 50, 400])) == []
        got += bulk.drain()
    assert [(c.epoch_seq, c._changes) for c in got] == streaming
    points = list(bulk.commit_points)
    assert [c for c, _ in points] == got
    for index in range(0, len(got), 5):
        _changeset, point = points[index]
        state: dict = {}
        for earlier in got[:index + 1]:
            apply(state, earlier)
        restarted = KafkaLog(partitions, bulk=True,
                             assembler=Assembler(state, position=point.token))
        for p, offset in point.offsets.items():
            restarted.seek(p, offset)
        resumed = Feeder(topic, random.Random(7),
                         next=[point.offsets.get(p, 0) for p in range(partitions)])
        resumed.feed(restarted)
        after = restarted.drain()
        assert [(c.epoch_seq, c._changes) for c in after] == streaming[index + 1:]
        for c in after:
            apply(state, c)
        assert bits(state) == run.final


def test_ahead_names_the_partitions_that_do_not_hold_the_cut_back(run: Run) -> None:
    """Two partitions read whole, one not at all: many epochs wait, the two are ahead;
    once the third is read, nothing waits."""
    topic = simulate_topic(run.items, 3, "native")
    log = KafkaLog(3, bulk=True)
    for p in (0, 2):
        for i, (key, value, headers) in enumerate(topic[p]):
            log.feed(p, i, key, value, headers)
    assert log.waiting_epochs() > 10
    assert log.ahead() == [0, 2]
    assert log.drain() == []
    for i, (key, value, headers) in enumerate(topic[1]):
        log.feed(1, i, key, value, headers)
    assert log.drain()
    assert log.waiting_epochs() == 0
    assert log.ahead() == []


def _damaged_topic(topic, kind: str, rng: random.Random):
    """One damage of ``kind`` at a random place of a simulated native topic."""
    import dataclasses

    from sinks.codec import decode, encode_epoch
    from sinks.kafka._markers import HEADER_PARTITION, HEADER_WHOLE

    topic = [list(msgs) for msgs in topic]
    events = _event_positions(topic)
    markers = [(p, i) for p, msgs in enumerate(topic) for i, (_k, _v, h) in enumerate(msgs)
               if h is not None]

    def forge(header: str, field: str, change: object, among: list | None = None) -> None:
        p, i = rng.choice(among or markers)
        key, value, headers = topic[p][i]
        headers = [(name, encode_epoch(dataclasses.replace(
            record := decode(raw), **{field: change(getattr(record, field))}))
            if name == header else raw) for name, raw in headers]
        topic[p][i] = (key, value, headers)

    if kind == "drop event":
        p, i = rng.choice(events)
        del topic[p][i]
    elif kind == "alter event":
        p, i = rng.choice(events)
        key, value, headers = topic[p][i]
        topic[p][i] = (key, value[:-1] + bytes([value[-1] ^ 1]), headers)
    elif kind == "drop marker":
        p, i = rng.choice(markers[:-3])  # not a partition's last (a log may end early)
        del topic[p][i]
    elif kind == "forge partition setsum":
        forge(HEADER_PARTITION, "setsum", lambda _: "1" * 64)
    elif kind == "forge partition count":
        forge(HEADER_PARTITION, "event_count", lambda n: n + 1)
    elif kind == "forge partition tables":
        shares = [(p, i) for p, i in markers  # a share with events: the bulk check's
                  if decode(dict(topic[p][i][2])[HEADER_PARTITION]).event_count]
        forge(HEADER_PARTITION, "table_counts",
              lambda counts: tuple((f"{name}x", n) for name, n in counts), shares)
    elif kind == "forge whole count":
        forge(HEADER_WHOLE, "event_count", lambda n: n + 1)
    elif kind == "duplicate":
        p, i = rng.choice(events + markers)
        topic[p].insert(rng.randint(i + 1, len(topic[p])), topic[p][i])
    elif kind == "forge partition quiescent":
        forge(HEADER_PARTITION, "quiescent", lambda quiet: not quiet)
    elif kind == "forge partition stream":
        forge(HEADER_PARTITION, "stream", lambda stream: stream + 1)
    elif kind == "late event":  # a new identity of a batch its partition already closed
        p, i = rng.choice(events)
        after = next((j for j in range(i + 1, len(topic[p])) if topic[p][j][2] is not None),
                     len(topic[p]) - 1)
        key, value, headers = topic[p][i]
        seq = int.from_bytes(value[20:24], "big") ^ 0x8000
        topic[p].insert(after + 1, (key, value[:20] + seq.to_bytes(4, "big") + value[24:],
                                    headers))
    return topic


@pytest.mark.parametrize("kind", ["drop event", "alter event", "drop marker",
                                  "forge partition setsum", "forge partition count",
                                  "forge partition tables", "forge whole count",
                                  "duplicate"])
@pytest.mark.parametrize("check", ["python", "arrow", "bulk"])
def test_damage_is_refused_after_only_true_changesets(
        run: Run, monkeypatch: pytest.MonkeyPatch, kind: str, check: str) -> None:
    """Damage anywhere (a few random places each): every changeset handed out is one of
    the undamaged topic's, in order; a copy changes nothing; anything else is refused
    with InconsistentLog (or, where only the tail is hit, nothing past it is handed out).
    Every way a partition's share is checked: one at a time at its marker in Python (few
    events) or in Arrow, or (bulk) all shares of a drain in one vectorised pass."""
    import zlib

    import replay._kafka_log as kafka_log

    monkeypatch.setattr(kafka_log, "_SMALL_SHARE", 0 if check == "arrow" else 512)
    bulk = check == "bulk"
    topic = simulate_topic(run.items, 3, "native")
    clean = [(c.epoch_seq, c._changes) for c in Feeder(topic, random.Random(4)).feed(
        KafkaLog(3))]
    rng = random.Random(zlib.crc32(f"{kind}/{check}".encode()))
    for _ in range(3):
        damaged = _damaged_topic(topic, kind, rng)
        log = KafkaLog(3, bulk=bulk)
        feeder = Feeder(damaged, random.Random(rng.randrange(100)))
        got: list = []
        error: InconsistentLog | None = None
        try:
            while sum(feeder.next) < sum(map(len, damaged)):
                got += feeder.feed(log, limit=rng.choice([7, 300]))
                if bulk:
                    got += log.drain()
        except InconsistentLog as exc:
            error = exc
            if bulk:
                got += log.drain() if log.failure is None else []
        if bulk and log.failure is not None:  # met by a drain, after what it returned
            error = error or log.failure
        handed = [(c.epoch_seq, c._changes) for c in got]
        assert handed == clean[:len(handed)], kind
        if kind == "duplicate":
            assert error is None and handed == clean
        else:
            assert error is not None or len(handed) < len(clean), kind
        if kind in ("drop event", "alter event", "forge partition tables"):
            # Found by the partition's own marker, before the epoch reaches the assembler.
            assert error is not None and "partition " in str(error), error


def test_bulk_check_names_the_first_bad_share_and_keeps_the_ones_before(run: Run) -> None:
    """check_shares on shares with a corrupt name in one message and an altered value in
    a later share: the first is the fault (named by partition and epoch), and exactly the
    events of the shares before it are kept for the assembler."""
    from replay._kafka_shares import check_shares
    from sinks.codec import native_events_batch

    log = KafkaLog(3, bulk=True)  # fed whole, not drained: its shares wait in the queue
    Feeder(simulate_topic(run.items, 3, "native"), random.Random(2)).feed(log)
    shares = [share for epoch in log._queued for share in epoch.shares][:6]
    assert len(shares) >= 6 and check_shares(shares).fault is None
    bad = [list(s[2]) for s in shares]
    value = bad[2][0]
    bad[2][0] = value[:38] + b"\xff" + value[39:]  # the table name is no UTF-8 any more
    bad[4][0] = bad[4][0][:-1] + bytes([bad[4][0][-1] ^ 1])
    checked = check_shares([(p, r, v) for (p, r, _e), v in zip(shares, bad, strict=True)])
    assert checked.fault == 2
    assert "corrupt event message" in str(checked.error)
    assert checked.error.epoch_seq == shares[2][1].epoch_seq
    kept = checked.first(2).data
    assert kept.num_rows == len(shares[0][2]) + len(shares[1][2])
    expected = native_events_batch(shares[0][2] + shares[1][2]).data
    assert sorted(kept.column("seq").to_pylist()) == sorted(expected.column("seq").to_pylist())
    checked = check_shares([(p, r, v) for (p, r, _e), v in
                            zip(shares[3:], bad[3:], strict=True)])
    assert checked.fault == 1 and "setsum" in str(checked.error)
    assert checked.first(1).data.num_rows == len(shares[3][2])  # not the bad share's
