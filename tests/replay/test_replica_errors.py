"""The PostgreSQL replica's errors are the project's PostgreSQL errors, chained."""

from __future__ import annotations

import psycopg
import pytest

import agent
import sinks
from replay import PostgresReplica, ReplicaError
from tests.services._proc import free_port


def test_replica_errors_are_postgres_errors() -> None:
    """One ``except PostgresError`` handles the store's and the replica's errors."""
    assert issubclass(ReplicaError, agent.PostgresError)
    assert agent.PostgresError is sinks.PostgresError
    assert issubclass(agent.WriteOutcomeUnknown, sinks.PostgresError)


def test_a_refused_connection_is_a_chained_postgres_error() -> None:
    """psycopg failing to connect comes out as ReplicaError naming the step, chained."""
    dsn = f"postgresql://cdc@127.0.0.1:{free_port()}/none"
    with pytest.raises(agent.PostgresError) as info:
        PostgresReplica(dsn, {"t": agent.TableSpec("k", ["v"])}, connect_timeout=1)
    assert type(info.value) is ReplicaError
    assert "connecting to the replica database failed" in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.Error)


def test_the_boundary_maps_psycopg_errors_only() -> None:
    """``replica_errors`` turns a psycopg error into ReplicaError naming the operation and
    the advice (given or computed from the error), chained; other errors pass through."""
    from replay._postgres_replica import replica_errors

    with pytest.raises(ReplicaError) as info, replica_errors("doing x", "try y"):
        raise psycopg.OperationalError("boom")
    assert str(info.value) == "PostgreSQL replica: doing x failed (boom); try y"
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    with pytest.raises(ReplicaError, match=r"failed \(bad\); said bad"), \
            replica_errors("doing x", lambda exc: f"said {exc}"):
        raise psycopg.errors.DivisionByZero("bad")
    with pytest.raises(KeyError), replica_errors("doing x"):
        raise KeyError("not ours")


def test_psycopg_errors_are_caught_in_one_place() -> None:
    """No other ``except`` in the replica names a psycopg error: the boundary is one."""
    import inspect
    import re

    import replay._postgres_replica as module

    source = inspect.getsource(module)
    assert len(re.findall(r"except [^\n]*psycopg", source)) == 1
    assert "except psycopg.Error as exc:" in inspect.getsource(module.replica_errors)
