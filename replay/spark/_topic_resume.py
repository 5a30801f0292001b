"""Resuming a topic stream's micro-batch where the previous one saved.

A wal3 stream (``_stream``) saves, after writing up to frontier ``W``, the cells at
``W`` and one log offset from which every record of a later interval is in the log.
A Kafka topic has one offset per partition and an epoch's events and markers are
spread over all of them, so the topic's saved point is, per partition, the lowest
offset of anything a later micro-batch still needs there:

- every epoch marker of a later epoch (a domain's epochs after its point in ``W``, and
  every marker of a domain ``W`` does not name yet): the resumed replay checks each
  partition's markers from the epoch after ``W`` on (``vouched_epochs(starts=...)``);
- every event of a later interval (after ``W``'s point, or past the verified epochs,
  or of a domain without a point yet), the first copy of each;
- the partition's end this micro-batch read up to (nothing before it is skipped).

Events of intervals up to ``W`` found after those offsets are late copies: the
resumed replay leaves them out (below its epoch floor), as a wal3 resume does. The
cells at ``W`` stand in for every earlier event, so each later event's ``old`` is
still checked against the value its cell held. A micro-batch with baseline chunks in
its range does not save (the next one replays from the start, as before).

The point is saved under the query's checkpoint (``cdc_agent_resume/<batch id>/``):
``cells`` (Parquet) then ``meta`` (one row: ``version``, ``format``, ``topic``,
``encoding``, ``frontier``, ``offsets`` as JSON), ``meta`` last. A reader of another
version, topic or encoding, or whose offsets the topic no longer holds (retention,
``deleteRecords``), does not resume: it replays the topic from its start and says why.
A restarted query's source (``_kafka_points.TopicScan``) also starts its look at the
topic at the newest saved point's offsets (``saved_topic_offsets``): every marker it
needs after the point's frontier is there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from replay._position import Frontier
from replay.spark._checkpoint import Resumed
from replay.spark._decode import signed_bits

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from replay.spark._replay import LogReplay
    from replay.spark._stream import SavedPoint

__all__ = ["TOPIC_RESUME_VERSION", "TopicResumed", "load_topic_resume", "marker_starts",
           "pending_events", "resume_offsets", "save_topic_resume", "saved_topic_offsets"]

TOPIC_RESUME_VERSION: Final = 1
_FORMAT: Final = "cdc-agent topic resume"
_META: Final = ("version int, format string, topic string, encoding string, "
                "frontier string, offsets string")


@dataclass(frozen=True)
class TopicResumed(Resumed):
    """A topic stream's saved point: the cells at ``frontier`` (``cells``) and, per
    partition, the offset the next micro-batch reads from (``offsets``)."""

    topic: str
    encoding: str
    offsets: tuple[int, ...]



def pending_events(until: Frontier) -> Column:
    """Rows of ``LogReplay._rows`` a replay resumed at ``until`` still needs: a domain
    ``until`` does not name, or after its point there (a later interval, or past the
    verified epochs: ids from the point's end on)."""
    from pyspark.sql import functions as F

    from replay.spark._frames import as_unsigned

    pending = ~F.col("domain").isin([signed_bits(p.domain_id) for p in until])
    for p in until:
        pending = pending | ((F.col("domain") == F.lit(signed_bits(p.domain_id))) & (
            (F.col("q") > F.lit(p.epoch_seq))
            | (F.col("q").isNull()
               & (as_unsigned(F.col("batch")) >= F.lit(Decimal(p.end_id))))))
    return pending


def resume_offsets(replay: LogReplay, until: Frontier) -> list[int] | None:
    """Per partition, where a replay resumed at ``until`` must start reading (see the
    module's docstring); None when it cannot resume (baselines, a domain with verified
    epochs but no point in ``until``)."""
    from pyspark.sql import functions as F

    from replay.spark._decode import KIND_EVENT
    from replay.spark._kafka import KafkaTopic

    source = replay.source
    if not isinstance(source, KafkaTopic):
        return None
    markers, chunks = replay.topic_metadata
    if (chunks or replay.baselines
            or {p.domain_id for p in until} != set(replay.epochs.epochs)):
        return None
    offsets = marker_starts(markers, {p.domain_id: p.epoch_seq for p in until}, source.end)
    needed = (replay._rows.filter((F.col("kind") == KIND_EVENT) & pending_events(until))
              .groupBy("partition").agg(F.min("offset").alias("first")).collect())
    for row in needed:
        p = int(row["partition"])
        offsets[p] = min(offsets[p], int(row["first"]))
    return offsets


def marker_starts(markers: Iterable[tuple[int, int, bytes, bytes]], at: Mapping[int, int],
                  ends: Sequence[int]) -> list[int]:
    """Per partition, the offset of its first marker that a replay resumed at ``at``
    (domain -> epoch) needs: of a later epoch, or of a domain ``at`` does not name
    (``ends[p]`` if none)."""
    from replay.spark._kafka import _epoch_record

    offsets = list(ends)
    wholes: dict[bytes, tuple[int, int]] = {}
    for partition, offset, _part, whole in markers:
        if whole not in wholes:
            record = _epoch_record(whole, f"partition {partition} offset {offset}")
            wholes[whole] = (record.domain_id, record.epoch_seq)
        domain_id, epoch_seq = wholes[whole]
        if domain_id not in at or epoch_seq > at[domain_id]:
            offsets[partition] = min(offsets[partition], offset)
    return offsets


def save_topic_resume(replay: LogReplay, folder: str, batch_id: int, until: Frontier) -> bool:
    """Save where a topic replay that wrote up to ``until`` can be resumed; False
    when it cannot be (``resume_offsets``)."""
    from replay.spark._kafka import KafkaTopic
    from replay.spark._stream import write_saved_point

    offsets = resume_offsets(replay, until)
    if offsets is None:
        return False
    source = replay.source
    assert isinstance(source, KafkaTopic)
    meta = (TOPIC_RESUME_VERSION, _FORMAT, source.topic, source.encoding, str(until),
            json.dumps(offsets))
    write_saved_point(replay, folder, batch_id, until, [meta], _META)
    return True


def load_topic_resume(spark: SparkSession, folder: str, applied: Frontier, topic: str,
                      encoding: str) -> tuple[TopicResumed | None, str]:
    """The newest saved point of ``topic`` if the changeset table (at ``applied``)
    holds nothing after it, else None and why not ("": nothing saved yet)."""
    from replay.spark._stream import newest_saved_point

    point = newest_saved_point(spark, folder)
    if point is None:
        return None, ""
    why = _not_of(point, topic, encoding)
    if why:
        return None, why
    if not point.fits(applied):
        return None, f"the table holds intervals after the saved point {point.name}"
    offsets = tuple(int(o) for o in json.loads(point.meta["offsets"]))
    return TopicResumed(point.frontier(), 0, point.path + "/cells", topic, encoding,
                        offsets), ""


def saved_topic_offsets(spark: SparkSession, folder: str, topic: str, encoding: str
                        ) -> tuple[Frontier, list[int]] | None:
    """The newest saved point of ``topic``'s frontier and offsets, whatever the table
    holds: where a restarted query's source starts its look at the topic
    (``TopicScan.resume_from``); None when there is none."""
    from replay.spark._stream import newest_saved_point

    point = newest_saved_point(spark, folder)
    if point is None or _not_of(point, topic, encoding):
        return None
    return (Frontier.of(point.frontier().values()),
            [int(o) for o in json.loads(point.meta["offsets"])])


def _not_of(point: SavedPoint, topic: str, encoding: str) -> str:
    """Why ``point`` is not a point of ``topic`` in ``encoding`` this reader reads
    ("" when it is)."""
    row, name = point.meta, point.name
    if row.get("format") != _FORMAT or row.get("version") != TOPIC_RESUME_VERSION:
        return (f"the saved point {name} is not a version-{TOPIC_RESUME_VERSION} topic "
                f"point (version {row.get('version')!r}, written by another cdc-agent?)")
    if row["topic"] != topic or row["encoding"] != encoding:
        return (f"the saved point {name} is of topic {row['topic']!r} ({row['encoding']}), "
                f"not {topic!r} ({encoding})")
    return ""
