"""A replica applier run as its own process, which SIGKILLs itself at a chosen step.

``python3 -m tests.replay._killed_applier DSN LOG STEP INDEX``: resumes from the
replica's stored position like a real applier (the Assembler starts from it), applies
the changesets of the pickled log one by one, and when applying the INDEX-th one
reaches STEP (see ``PostgresReplica.apply_many``) kills itself with SIGKILL. With
INDEX -1 it runs to the end and prints ``applied N``.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys

from agent._demo_postgres import DEMO_TABLES
from replay import Assembler
from replay._postgres_replica import PostgresReplica


def main(argv: list[str]) -> int:
    dsn, log_path, kill_step, kill_index = argv[0], argv[1], argv[2], int(argv[3])
    with open(log_path, "rb") as f:
        records = pickle.load(f)
    armed = False

    def fault(step: str) -> None:
        if armed and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

    replica = PostgresReplica(dsn, DEMO_TABLES, fault=fault)
    position = replica.position
    assembler = Assembler(initial_state=replica.snapshot(),
                          position=None if position is None else str(position))
    applied = 0
    for n, changeset in enumerate(assembler.changesets(records)):
        armed = n == kill_index
        applied += replica.apply(changeset)
    replica.close()
    print(f"applied {applied}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
