"""A topic stream resumes: each micro-batch reads the topic from the per-partition
offsets its previous one saved (``replay.spark._topic_resume``), not from the start.

The topics here are copies of two rounds written by ``KafkaSink`` (round B by new
agents, so new domains), produced in steps: "half" is every message of a round except
the second half of partition 2, so a micro-batch ends at a quiescence point whose
later epochs' markers and events already sit in partitions 0 and 1 (the saved offsets
there must go back to them). Each micro-batch costs seconds: the tests run few.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from replay import Frontier
from replay.spark import stream_changesets
from sinks.codec import HEADER_PARTITION, HEADER_WHOLE
from sinks.kafka import KafkaSink
from tests.services.kafka import KafkaBroker
from tests.spark._logs import Logged, check_streamed, write_log
from tests.spark.test_kafka import Message, _is_event, _is_marker, _produce, _read_all, _whole

pytestmark = [
    pytest.mark.spark, pytest.mark.kafka,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

_names = itertools.count(1)
_SPAN = re.compile(r"(\d+) messages, offsets \[([\d, ]*)\] up to \[([\d, ]*)\]")


class Rounds:
    """Round A and round B of one topic, and their messages, partition by partition."""

    def __init__(self, a: Logged, b: Logged, first: list[Message], both: list[Message]):
        self.a, self.b = a, b
        self.first = {p: [m for m in first if m[0] == p] for p in range(3)}
        every = {p: [m for m in both if m[0] == p] for p in range(3)}
        self.second = {p: every[p][len(self.first[p]):] for p in range(3)}

    def all_of_a(self) -> list[Message]:
        return [m for p in range(3) for m in self.first[p]]

    def half_of_a(self) -> tuple[list[Message], list[Message]]:
        """Round A without the second half of partition 2 (from past its first
        quiescence marker of each domain on), and that half."""
        return _half(self.first, len(self.a.tables))

    def half_of_b(self) -> tuple[list[Message], list[Message]]:
        """The same of round B."""
        return _half(self.second, len(self.b.tables))


def _half(round: dict[int, list[Message]], domains: int) -> tuple[list[Message], list[Message]]:
    two = round[2]
    seen: set[int] = set()
    cut = len(two) // 2
    for i, m in enumerate(two):
        if _is_marker(m) and _whole(m).quiescent:
            seen.add(_whole(m).domain_id)
            if len(seen) == domains:
                cut = max(cut, i + 1)
                break
    return [*round[0], *round[1], *two[:cut]], two[cut:]


def _moved_late(ms: list[Message], epochs: set[tuple[int, int]]) -> list[Message]:
    """The first event of one of ``epochs`` (domain, epoch) that has its partition's
    marker of its epoch after it, moved right after that marker."""
    from sinks.codec import decode_native_event

    for i, m in enumerate(ms):
        if not _is_event(m):
            continue
        event = decode_native_event(m[2] or b"")
        for j in range(i + 1, len(ms)):
            if ms[j][0] == m[0] and _is_marker(ms[j]):
                w = _whole(ms[j])
                if (w.domain_id == event.domain_id and w.begin_id <= event.batch_id < w.end_id
                        and (w.domain_id, w.epoch_seq) in epochs):
                    return [*ms[:i], *ms[i + 1:j + 1], m, *ms[j + 1:]]
    raise AssertionError("no event with its marker after it")


def _topic(broker: KafkaBroker, stem: str) -> str:
    return broker.create_topic(f"resume-{stem}-{next(_names)}", 3)


@pytest.fixture(scope="module")
def rounds(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Rounds:
    topic = _topic(kafka_broker, "source")
    uri = f"kafka://{kafka_broker.bootstrap}/{topic}"
    tmp = tmp_path_factory.mktemp("tr")
    logs = []
    for seed, prefix in ((61, ""), (62, "more_")):
        sink = KafkaSink(kafka_broker.bootstrap, topic, partitions=3)
        logs.append(write_log(tmp / prefix, domains=2, threads=2, batches=12, rows=10,
                              seed=seed, sink=sink, uri=uri, table_prefix=prefix))
        if seed == 61:
            first = _read_all(kafka_broker.bootstrap, topic)
    return Rounds(logs[0], logs[1], first, _read_all(kafka_broker.bootstrap, topic))


class Stream:
    """One topic, one changeset table, one checkpoint; queries started on them."""

    def __init__(self, spark: Any, broker: KafkaBroker, tmp: Path, stem: str) -> None:
        self.spark, self.broker = spark, broker
        self.topic = _topic(broker, stem)
        self.uri = f"kafka://{broker.bootstrap}/{self.topic}"
        self.out, self.checkpoint = str(tmp / "changes"), str(tmp / "checkpoint")
        self.said: list[str] = []
        self.seen: list[tuple[int, int]] = []

    def produce(self, messages: list[Message]) -> None:
        _produce(self.broker.bootstrap, self.topic, messages)

    def start(self, on_batch: Any = None) -> Any:
        def record(batch_id: int, rows: int) -> None:
            self.seen.append((batch_id, rows))
            if on_batch is not None:
                on_batch(batch_id, rows)

        return stream_changesets(self.spark, self.uri, self.out, checkpoint=self.checkpoint,
                                 format="parquet", interval="0 seconds", on_batch=record,
                                 progress=self.said.append)

    def run(self, on_batch: Any = None) -> None:
        query = self.start(on_batch)
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    def span(self, text: str) -> tuple[int, list[int], list[int]]:
        """(messages read, start offsets, end offsets) a progress message names."""
        found = _SPAN.search(text)
        assert found is not None, text
        return (int(found.group(1)), [int(x) for x in found.group(2).split(",")],
                [int(x) for x in found.group(3).split(",")])

    # (read with pyarrow: a Spark job per look would cost seconds)
    def saved(self) -> dict[str, Any]:
        """The newest saved point's meta row."""
        import pyarrow.parquet as pq

        folder = sorted((Path(self.checkpoint) / "cdc_agent_resume").iterdir())[-1]
        return dict(pq.read_table(folder / "meta").to_pylist()[0])

    def rows(self) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        return list(pq.read_table(self.out).to_pylist())


def _upto(log: Logged, frontier: dict[int, int], rows: list[Any]) -> Logged:
    """``log`` as far as the quiescence points ``frontier`` (domain -> epoch) reach; a
    domain whose points there are all empty (no row of it in ``rows``) left out."""
    points = {k: v for k, v in log.at_quiescence.items() if k[1] <= frontier[k[0]]}
    empty = {d for d in log.tables if not any(v for k, v in points.items() if k[0] == d)}
    assert not any(r["_domain"] % (1 << 64) in empty for r in rows)
    tables = {d: t for d, t in log.tables.items() if d not in empty}
    points = {k: v for k, v in points.items() if k[0] in tables}
    final: dict[Any, bytes] = {}
    for d in tables:
        final.update(points[(d, max(e for dd, e in points if dd == d))])
    return Logged(log.uri, log.path, tables, points, final)


def test_micro_batches_resume_from_the_saved_offsets_and_still_refuse_a_lost_event(
        spark: Any, kafka_broker: KafkaBroker, rounds: Rounds, tmp_path: Path) -> None:
    """Batch 0 replays "half" of A from the start and saves offsets below partitions 0
    and 1's ends (their later epochs are needed). The rest of A and B but the second
    half of B's partition 2 arrive; the restarted query's micro-batch reads from those
    offsets (fewer messages than the topic holds) and the table composes to the store's
    state at every point up to where it got, no interval twice. In B's partition 0 an
    event of an epoch that partition 2 vouches for only in that held-back half was moved
    after partition 0's marker of its epoch (lost to that epoch): once the half arrives,
    the next micro-batch, resumed from its predecessor's saved offsets, stops the query
    with InconsistentLog and writes nothing.

    (A micro-batch crashed after its write and rerun: test_stream_resume's restart test
    runs the same foreachBatch, and load_topic_resume takes a point the table is at.)"""
    s = Stream(spark, kafka_broker, tmp_path, "live")
    half, rest = rounds.half_of_a()
    s.produce(half)
    s.run()
    assert "from its start" in s.said[0] and s.seen[0][1] > 0
    offsets = json.loads(s.saved()["offsets"])
    assert offsets[0] < len(rounds.first[0]) or offsets[1] < len(rounds.first[1])
    # (how far back partitions 0 and 1 must go depends on how the writers interleaved)
    assert offsets[2] <= len(half) - len(rounds.first[0]) - len(rounds.first[1])

    most_of_b, held = rounds.half_of_b()
    later = {(w.domain_id, w.epoch_seq) for w in map(_whole, filter(_is_marker, held))}
    zero = len(rounds.second[0])
    s.produce([*rest, *_moved_late(most_of_b[:zero], later), *most_of_b[zero:]])
    query = s.start()
    try:
        query.processAllAvailable()
        assert "resumed at" in s.said[1] and s.seen[1][1] > 0
        read, start, end = s.span(s.said[1])
        assert start == offsets and read == sum(end) - sum(offsets)
        print(f"\ntopic of {sum(end)} messages: the resumed micro-batch read {read} (from "
              f"{offsets})")
        saved = s.saved()
        at = {p.domain_id: p.epoch_seq for p in Frontier.parse(saved["frontier"])}
        rows = s.rows()
        b = _upto(rounds.b, at, rows)
        check_streamed(rows, [rounds.a, b], python={**rounds.a.final, **b.final})
        s.produce(held)
        with pytest.raises(Exception, match=r"InconsistentLog: .*events of this epoch before"):
            query.processAllAvailable()
    finally:
        query.stop()
    assert "resumed at" in s.said[-1] and len(s.said) == 3
    assert s.span(s.said[-1])[1] == json.loads(saved["offsets"])
    assert len(s.rows()) == len(rows)

    # Partition 0 loses its messages up to just past the saved offset (deleteRecords, as
    # retention would): the restarted query's micro-batch does not resume, says so, and
    # replays from the topic's start, which no longer holds the domains' first epochs:
    # the query stops with InconsistentLog (never a state the topic cannot prove).
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    kept = json.loads(saved["offsets"])[0]
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    for future in admin.delete_records([TopicPartition(s.topic, 0, kept + 1)]).values():
        future.result(30)
    with pytest.raises(Exception, match="InconsistentLog"):
        s.run()
    assert len(s.said) == 4 and "from its start" in s.said[-1] and (
        f"the saved point starts at offset {kept}" in s.said[-1]), s.said[-1]


def test_retention_before_the_saved_offsets_does_not_stop_a_resume(
        spark: Any, kafka_broker: KafkaBroker, rounds: Rounds, tmp_path: Path) -> None:
    """After batch 0 replayed round A and saved its point, every partition loses its
    messages up to the saved offset (deleteRecords, as retention would): everything the
    point stands for. Round B arrives; the restarted query resumes from the saved
    offsets (the topic still holds them) and the table composes to the store's state at
    every point of both rounds. (From "half" of A the saved offsets may all be 0: a
    domain with no point yet needs its markers from the start.) The points source's
    first look, given the saved point, also reads from the saved offsets only."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    s = Stream(spark, kafka_broker, tmp_path, "retained")
    s.produce(rounds.all_of_a())
    s.run()
    offsets = json.loads(s.saved()["offsets"])
    _look_starts_at_the_saved_offsets(s, rounds, offsets)
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    gone = [TopicPartition(s.topic, p, o) for p, o in enumerate(offsets) if o > 0]
    assert gone, offsets
    for tp, future in admin.delete_records(gone).items():
        assert future.result(30).low_watermark == tp.offset  # the records are gone
    s.produce([m for p in range(3) for m in rounds.second[p]])
    s.run()
    resumed = [said for said in s.said[1:] if "resumed at" in said]
    assert resumed and not any("not resumed" in said for said in s.said[1:]), s.said
    assert s.span(resumed[0])[1] == offsets
    check_streamed(s.rows(), [rounds.a, rounds.b],
                   python={**rounds.a.final, **rounds.b.final})


def _look_starts_at_the_saved_offsets(s: Stream, rounds: Rounds, offsets: list[int]) -> None:
    """The points source as Spark builds it for a restarted query (the options
    ``points_stream`` gives it, read by its stream reader in a Python worker), run here
    against the broker: its first look reads only the markers from the saved offsets
    on, and finds the frontier a look from the topic's start finds."""
    from replay.spark._stream import POINTS_SCHEMA, QuiescencePoints

    saved = s.saved()
    options = {"uri": s.uri, "encoding": "native"}
    fresh: Any = QuiescencePoints(options).streamReader(POINTS_SCHEMA)
    resumed: Any = QuiescencePoints({**options, "resume_offsets": saved["offsets"],
                                "resume_frontier": saved["frontier"]}
                               ).streamReader(POINTS_SCHEMA)
    assert resumed.latestOffset()["frontier"] == fresh.latestOffset()["frontier"]
    after = sum(_is_marker(m) for p in range(3) for m in rounds.first[p][offsets[p]:])
    assert fresh._topic.taken == sum(map(_is_marker, rounds.all_of_a())) > after
    assert resumed._topic.taken == after
    print(f"\nthe resumed look read {after} of {fresh._topic.taken} markers")


def test_a_saved_point_of_another_version_topic_or_encoding_is_not_loaded(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_topic_resume`` takes the newest saved point only if it is a version-1
    topic point of this topic and encoding that the table has not gone past; else None
    and why (the micro-batch then replays from the start and says so). A wal3 stream
    does not take a topic's point. A query started on the checkpoint hands the point
    to its source (its look at the topic starts there), whatever the table holds."""
    import replay.spark._stream as stream
    from replay import Frontier, Position
    from replay.spark._stream import load_resume
    from replay.spark._topic_resume import TOPIC_RESUME_VERSION, load_topic_resume

    folder = str(tmp_path / "checkpoint" / "cdc_agent_resume")
    at = Frontier.of([Position(5, 3, 40)])
    good = {"version": TOPIC_RESUME_VERSION, "format": "cdc-agent topic resume",
            "topic": "t", "encoding": "native", "frontier": str(at), "offsets": "[4, 0, 7]"}
    schema = ("version int, format string, topic string, encoding string, "
              "frontier string, offsets string")

    def save(meta: dict[str, Any]) -> None:
        here = f"{folder}/{0:012d}"
        spark.createDataFrame([(0,)], "x int").write.mode("overwrite").parquet(
            here + "/cells")
        spark.createDataFrame([tuple(meta.values())], schema).write.mode(
            "overwrite").parquet(here + "/meta")

    assert load_topic_resume(spark, folder, Frontier.of([]), "t", "native") == (None, "")
    save(good)
    point, why = load_topic_resume(spark, folder, Frontier.of([Position(5, 2, 30)]),
                                   "t", "native")
    assert point is not None and why == "" and point.offsets == (4, 0, 7)
    assert point.frontier == {5: Position(5, 3, 40)}
    # A micro-batch rerun after it wrote and saved: the table is at the point.
    assert load_topic_resume(spark, folder, at, "t", "native")[0] == point
    assert load_resume(spark, folder, Frontier.of([])) is None  # not a wal3 point
    for change, said in ((("version", 2), "not a version-1 topic point"),
                         (("format", "other"), "not a version-1 topic point"),
                         (("topic", "u"), "of topic 'u' (native), not 't'"),
                         (("encoding", "debezium"), "of topic 't' (debezium)")):
        save({**good, change[0]: change[1]})
        point, why = load_topic_resume(spark, folder, Frontier.of([]), "t", "native")
        assert point is None and said in why, why
    save(good)
    point, why = load_topic_resume(spark, folder, Frontier.of([Position(5, 4, 50)]),
                                   "t", "native")
    assert point is None and "the table holds intervals after" in why

    def source(*args: Any, resume: Any = None, **kwargs: Any) -> Any:
        raise LookupError(resume)

    monkeypatch.setattr(stream, "points_stream", source)
    for topic, seed in (("t", (at, [4, 0, 7])), ("u", None)):
        with pytest.raises(LookupError) as started:
            stream_changesets(spark, f"kafka://127.0.0.1:1/{topic}", str(tmp_path / "out"),
                              checkpoint=str(tmp_path / "checkpoint"))
        assert started.value.args == (seed,)


def test_markers_checked_from_a_saved_point(rounds: Rounds) -> None:
    """``vouched_epochs(starts=...)``: each partition's markers from the epoch after a
    domain's point on give the same epochs as from the start (old copies skipped); a
    partition whose first marker after the point is missing is refused."""
    from replay import InconsistentLog, Position
    from replay.spark._kafka import vouched_epochs
    from replay.spark._topic_resume import marker_starts

    offset = dict.fromkeys(range(3), 0)
    markers = []
    for m in rounds.all_of_a():
        if _is_marker(m):
            headers = dict(m[3])
            markers.append((m[0], offset[m[0]], headers[HEADER_PARTITION],
                            headers[HEADER_WHOLE]))
        offset[m[0]] += 1
    records, _ = vouched_epochs(markers, 3)
    point = {}
    for r in records:
        if r.quiescent and r.epoch_seq <= 4:
            point[r.domain_id] = Position(r.domain_id, r.epoch_seq, r.end_id)
    assert set(point) == {r.domain_id for r in records}
    later = [r for r in records if r.epoch_seq > point[r.domain_id].epoch_seq]

    def epoch(marker: tuple[int, int, bytes, bytes]) -> tuple[int, int]:
        w = _whole((0, None, None, [(HEADER_WHOLE, marker[3])]))
        return w.domain_id, w.epoch_seq

    # In each partition, from the earliest of the domains' markers of their points on
    # (so old copies of earlier epochs come too).
    cut = {p: min(mk[1] for mk in markers
                  if mk[0] == p and epoch(mk)[1] == point[epoch(mk)[0]].epoch_seq)
           for p in range(3)}
    tail = [mk for mk in markers if mk[1] >= cut[mk[0]]]
    again, offsets = vouched_epochs(tail, 3, point)
    assert again == later
    # What a saved point keeps: from each partition's first marker of a later epoch.
    starts = marker_starts(markers, {d: p.epoch_seq for d, p in point.items()},
                           [offset[p] for p in range(3)])
    assert all(mk[1] >= starts[mk[0]] for mk in markers
               if epoch(mk)[1] > point[epoch(mk)[0]].epoch_seq)
    assert vouched_epochs([mk for mk in markers if mk[1] >= starts[mk[0]]], 3,
                          point)[0] == later
    assert all(len(o) == sum(1 for mk in tail if mk[0] == p and epoch(mk)[0] == d
                             and epoch(mk)[1] > point[d].epoch_seq)
               for (p, d), o in offsets.items())
    d = next(iter(point))
    lost = next(i for i, mk in enumerate(tail)
                if epoch(mk) == (d, point[d].epoch_seq + 1) and mk[0] == 1)
    with pytest.raises(InconsistentLog, match="partition 1 skips from epoch"):
        vouched_epochs(tail[:lost] + tail[lost + 1:], 3, point)
