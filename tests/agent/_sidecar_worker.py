"""A client process for the sidecar tests: ``python3 -m tests.agent._sidecar_worker``.

    write SOCKET NAME BATCHES SEED   two threads write rows "<NAME>-*" of the process's
                                     own MemoryStore, then print its state as one line
    hang SOCKET NAME                 open a batch, write and report three cells, print
                                     the state, then wait for stdin to close (the test
                                     SIGKILLs it mid-batch)

The state line is JSON: a list of [table, row, column, value] in the protocol's value
encoding, so every bit survives.
"""

from __future__ import annotations

import json
import random
import sys
import threading

from agent import MemoryStore
from agent.sidecar import SidecarClient
from agent.sidecar._protocol import encode_value


def _print_state(store: MemoryStore) -> None:
    state = [[t, r, c, encode_value(v)] for (t, r, c), v in store.snapshot().items()]
    print(json.dumps(state), flush=True)


def _write(client: SidecarClient, name: str, batches: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = [f"{name}-{i}" for i in range(4)]
    for _ in range(batches):
        with client.batch():
            for _ in range(rng.randrange(1, 4)):
                row, column = rng.choice(rows), rng.choice("ab")
                if rng.random() < 0.2:
                    client.delete("t", row, column)
                else:
                    client.set("t", row, column, rng.choice(
                        [None, rng.random(), -0.0, float("nan"), rng.randbytes(3),
                         rng.randrange(-(1 << 63), 1 << 63), "é"]))


def main(argv: list[str]) -> None:
    mode, path, name = argv[:3]
    store = MemoryStore()
    client = SidecarClient(path, store, client_name=f"worker-{name}")
    if mode == "write":
        batches, seed = int(argv[3]), int(argv[4])
        threads = [threading.Thread(target=_write, args=(client, name, batches, seed + i))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        client.close()
        _print_state(store)
        return
    scope = client.batch()
    scope.__enter__()
    client.set("t", f"{name}-0", "a", 1)
    client.update("t", [f"{name}-1", f"{name}-2"], {"b": b"\xff"})
    _print_state(store)
    sys.stdin.read()  # held open until the test kills this process


if __name__ == "__main__":
    main(sys.argv[1:])
