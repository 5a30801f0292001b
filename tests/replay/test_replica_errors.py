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
    assert "cannot connect to the replica database" in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.Error)
