"""A baseline's journal: whether the log holds the whole store, kept where a restart
finds it.

A baseline cut short (the program or ``cdc-agent snapshot`` died mid-way) cannot be
continued: the restarted agent is a new domain, and the dead one may have changed rows
its chunks already covered in an interval that will never be verified. Nor is a
finished baseline enough after a crash: writes the dead agent made after it may have
reached the store but not the log. So after any unclean end a restart must take a new
baseline from chunk 0; the journal makes that automatic. The states:

- ``running``: a baseline is under way (written before its chunk 0);
- ``done``: it finished (every chunk durable), and its agent is still running;
- ``closed``: that agent (or a later one started from ``closed``) closed cleanly, every
  write flushed: the log holds the whole store.

Called with a journal, ``Agent.snapshot`` (and ``cdc-agent snapshot --journal URI``)
finds ``closed``: it takes no baseline, marks the journal ``done`` for this agent (it
is running now) and returns the recorded report; finds ``running`` or ``done`` (the
agent died: ``cdc.baseline_retaken`` is logged) or nothing: it takes a new baseline.
A clean ``close()`` of the agent then writes ``closed``. So a program calls
``snapshot(journal=...)`` at every start, and a baseline is taken exactly when needed.

The journal is one small JSON object (``JOURNAL_VERSION``) in an object store (a
local directory, S3, or memory), replaced whole by each ``put``; ``closed`` is written
only over the ``done`` entry its agent read (a conditional put). A journal records one
domain: give each capturing agent (or sidecar) its own journal.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

import structlog

from sinks.objstore import (
    NotFound,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    open_store,
)

if TYPE_CHECKING:
    from agent._baseline import BaselineReport

__all__ = ["JOURNAL_VERSION", "BaselineJournal", "JournalError"]

log = structlog.get_logger()

JOURNAL_VERSION: Final = 1
DEFAULT_KEY: Final = "baseline-journal.json"


class JournalError(ValueError):
    """The journal object is not one this version wrote."""


class BaselineJournal:
    """Where ``snapshot(journal=...)`` records a baseline's progress (one object)."""

    def __init__(self, store: ObjectStore, key: str = DEFAULT_KEY) -> None:
        self.store = store
        self.key = key

    @classmethod
    def at(cls, uri: str, key: str = DEFAULT_KEY) -> BaselineJournal:
        """The journal in the object store ``uri`` (``file:///dir``, ``s3://...``)."""
        return cls(open_store(uri), key)

    def read(self) -> dict[str, Any] | None:
        """The journal's content, or None when there is none."""
        return self._read()[0]

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        """The journal's content and its etag (None, None when there is none)."""
        try:
            raw, etag = self.store.get(self.key)
        except NotFound:
            return None, None
        try:
            entry = json.loads(raw)
            version, state = entry["version"], entry["state"]
        except (ValueError, TypeError, KeyError) as exc:
            raise JournalError(f"baseline journal {self.key!r} in {self.store.describe()} is "
                               f"not a journal ({exc}); remove it to take a new baseline"
                               ) from exc
        if version != JOURNAL_VERSION or state not in ("running", "done", "closed"):
            raise JournalError(f"baseline journal {self.key!r} in {self.store.describe()} has "
                               f"version {version!r}, state {state!r}: not one this version "
                               f"writes (version {JOURNAL_VERSION}); upgrade, or remove it "
                               "to take a new baseline")
        return dict(entry), etag

    def started(self, domain_id: int, baseline_id: int) -> None:
        """Step 1 of a baseline: it runs (a restart that finds this takes a new one)."""
        self._put({"state": "running", "domain_id": domain_id, "baseline_id": baseline_id})

    def finished(self, report: BaselineReport, domain_id: int) -> None:
        """Every chunk is durable in the sink; agent ``domain_id`` runs on from it."""
        self._put({"state": "done", "domain_id": domain_id, "report": asdict(report)})

    def adopted(self, entry: dict[str, Any], domain_id: int) -> None:
        """A ``closed`` journal's baseline, continued by agent ``domain_id``."""
        self._put({"state": "done", "domain_id": domain_id, "report": entry["report"]})

    def closed(self, domain_id: int) -> None:
        """Agent ``domain_id`` closed cleanly: every write is in the log. A store
        failure here is logged, not raised: the next start then retakes a baseline."""
        try:
            entry, etag = self._read()
            if entry is None or entry["state"] != "done" or entry.get("domain_id") != domain_id:
                return  # another agent's journal now: leave it
            assert etag is not None
            # Only over the entry just read: another agent's baseline that started
            # meanwhile ("running") must not be overwritten by "closed".
            self._put({**entry, "state": "closed"}, etag=etag)
        except PreconditionFailed:
            log.warning("cdc.baseline_journal_not_closed", journal=self.key,
                        error="another agent wrote the journal meanwhile",
                        consequence="left as that agent wrote it")
        except (ObjectStoreError, JournalError) as exc:
            log.warning("cdc.baseline_journal_not_closed", journal=self.key, error=str(exc),
                        consequence="the next start takes a new baseline")

    def _put(self, entry: dict[str, Any], *, etag: str | None = None) -> None:
        """Write ``entry`` (over the version ``etag`` names only, if given)."""
        body = json.dumps({"version": JOURNAL_VERSION, **entry}, sort_keys=True).encode()
        if etag is None:
            self.store.put(self.key, body)
        else:
            self.store.put_if_match(self.key, body, etag)


def finished_report(entry: dict[str, Any]) -> BaselineReport:
    """The report a ``done`` journal recorded."""
    from agent._baseline import BaselineReport

    try:
        fields = dict(entry["report"])
        fields["first_point"] = tuple(fields["first_point"])
        fields["last_point"] = tuple(fields["last_point"])
        return BaselineReport(**fields)
    except (TypeError, KeyError, ValueError) as exc:
        raise JournalError(f"baseline journal: its report does not fit ({exc}); remove it "
                           "to take a new baseline") from exc


def note_previous(journal: BaselineJournal, entry: dict[str, Any] | None) -> None:
    """Log why a new baseline is taken: the last agent died (a cut baseline is
    discarded, never continued)."""
    if entry is not None:
        log.warning("cdc.baseline_retaken", domain_id=f"{entry.get('domain_id', 0):016x}",
                    found=entry["state"], journal=journal.key,
                    reason="the baseline was cut short" if entry["state"] == "running"
                    else "its agent ended without a clean close",
                    action="taking a new baseline from chunk 0")
