"""``replay.spark.SESSION_SETTINGS`` take effect, and a replay under them gives the same
results. The test session starts with them, except that it keeps cached plans' shuffles
in two partitions (``tests/services/spark.py``); ``cdc-agent spark`` starts with all."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import bits
from tests.services.spark import COALESCE_CACHED
from tests.spark._logs import Logged

pytestmark = [
    pytest.mark.spark,
    # PySpark leaves a result socket to the garbage collector (not ours to close).
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
SHUFFLES = "spark.sql.shuffle.partitions"


def _round_trips(build: Any) -> int:
    """How many commands ``build()`` sends to the JVM."""
    from py4j.clientserver import ClientServerConnection

    sent = 0
    send = ClientServerConnection.send_command

    def counting(self: Any, command: str) -> Any:
        nonlocal sent
        sent += 1
        return send(self, command)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClientServerConnection, "send_command", counting)
        build()
    return sent


def test_column_expressions_cost_no_call_site_round_trips(spark: Any) -> None:
    """PySpark records each column expression's Python call site in the JVM unless
    ``spark.python.sql.dataFrameDebugging.enabled`` is off (it reads the setting once,
    from the session): each function and Column method then costs about seven more
    round trips (the session, the setting, the call site set and cleared). A PySpark
    that renames or ignores the setting fails here."""
    import pyspark.errors.utils as origin
    from pyspark.sql import functions as F

    from replay.spark import SESSION_SETTINGS

    key = "spark.python.sql.dataFrameDebugging.enabled"
    assert SESSION_SETTINGS[key] == "false"
    assert spark.conf.get(key) == "false"

    def expression() -> Any:
        return (F.col("a") + F.lit(1)).alias("b")

    expression()  # the first one also looks classes up in the JVM
    sent = _round_trips(expression)
    with pytest.MonkeyPatch.context() as patch:  # what the setting left on would cost
        patch.setattr(origin, "_enable_debugging_cache", True)
        recording = _round_trips(expression)
    # measured: 8 against 38 (more in both after other tests' sessions)
    assert 0 < 2 * sent < recording, (sent, recording)


def test_a_replay_whose_cached_shuffles_coalesce_is_the_same(spark: Any,
                                                             logged: Logged) -> None:
    """With SESSION_SETTINGS' coalescing of cached plans (the test session keeps it off,
    so shuffles stay split in two), AQE merges the shuffle partitions of what a replay
    caches: the cells and the report come out the same, bit for bit."""
    from replay.spark import SESSION_SETTINGS, LogReplay, to_state

    assert SESSION_SETTINGS[COALESCE_CACHED] == "true"
    kept = {key: spark.conf.get(key) for key in (COALESCE_CACHED, SHUFFLES)}
    spark.conf.set(COALESCE_CACHED, "true")
    spark.conf.set(SHUFFLES, "16")  # more than a small log needs: AQE merges them
    replay = LogReplay(spark, logged.uri)
    try:
        state = bits(to_state(replay.snapshot()))
        report = replay.verify().collect()
        walked = replay._walked.rdd.getNumPartitions()
    finally:
        replay.unpersist()
        for key, value in kept.items():
            spark.conf.set(key, value)
    assert state == logged.final
    assert all(r["count_ok"] and r["tables_ok"] and r["setsum_ok"] for r in report)
    assert sum(r["events"] for r in report) == logged.events
    assert sum(r["quiescent"] for r in report) == len(logged.at_quiescence)
    assert walked < 16, walked  # coalesced: the setting took effect
