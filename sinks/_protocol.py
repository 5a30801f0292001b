"""The sink protocol every destination implements, and the errors sinks raise."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sequencer import EpochRecord
from sinks.codec import EventBatch

__all__ = ["Sink", "SinkBackpressure", "SinkClosed", "SinkError", "SinkTimeout"]


class SinkError(Exception):
    """A sink could not take or keep records. The message says what was kept."""


class SinkTimeout(SinkError):
    """A sink did not make records durable within the time allowed."""


class SinkBackpressure(SinkTimeout):
    """The sink is behind and took nothing of this call: the same call may be retried.

    The agent's shipper retries it (writers slow down meanwhile); a sink raises it only
    when nothing of the records was queued, so a retry cannot duplicate them.
    """


class SinkClosed(SinkError):
    """Records were handed to a sink after ``close()``."""


@runtime_checkable
class Sink(Protocol):
    """Where the agent ships records. One thread calls it, in log order.

    - ``write_events``: events of one or more write batches; each segment whole, in
      seq order (see ``sinks.codec``).
    - ``write_epoch``: an epoch record, after every event of its epoch, with its
      setsum filled in.
    - ``write_epochs`` (optional): a run of epoch records (``sinks.codec.EpochRun``),
      in order, each after every event of its epoch: what ``write_epoch`` of each would
      do, in one call; all or nothing if it raises ``SinkBackpressure``. The agent uses
      it when present (an automatic batch closes two epochs: one call each costs more
      than the batch).
    - ``write_shipment`` (optional): a shipment's records in one call, in order (its
      ``EventBatch``, then its ``EpochRun`` or ``EpochRecord``s): what the calls above
      would do one by one; all or nothing if it raises ``SinkBackpressure``. The agent
      uses it when present (a wal3 log stores the shipment in one fragment, up to the
      writer's batch size).
    - ``flush``: return once everything written so far is durable, or raise.
    - ``close``: flush, then release resources; calling it twice is fine.

    Vendor exceptions never escape: a sink maps them to ``SinkError`` subclasses.
    """

    def write_events(self, batch: EventBatch) -> None: ...

    def write_epoch(self, record: EpochRecord) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
