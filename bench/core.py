"""Core benchmarks: id generation, capture overhead, assembler throughput.

Run: ``python3 -m bench.core [--events N]``. Every figure is a ratio against a
baseline measured in the same run, best of several runs.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import sequencer
from agent import Agent, MemoryStore, system_ids
from agent._native import native_in_use
from bench._util import best_of, report, write_overlapping_batches
from replay import Assembler
from sinks import MemorySink


def bench_ids(n: int) -> None:
    clock, boottime = time.clock_gettime_ns, time.CLOCK_BOOTTIME

    def bare() -> int:
        for _ in range(n):
            clock(boottime)
        return n

    ids = system_ids()

    def monotonic() -> int:
        nxt = ids.next
        for _ in range(n):
            nxt()
        return n

    rates = [(best_of(1, monotonic), best_of(1, bare)) for _ in range(5)]  # interleaved
    report("ids: MonotonicIds.next()", max(r for r, _ in rates),
           "clock_gettime_ns", max(b for _, b in rates), "ids/s", "ratio >= 0.25, i.e. <= 4x")


class NullSink:
    """Drops records: measures capture and shipping, not a destination."""

    def write_events(self, batch: object) -> None: ...
    def write_epoch(self, record: object) -> None: ...
    def write_epochs(self, run: object) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def bench_capture(threads: int, per_thread: int, batch_size: int,
                  inserts: bool = False) -> None:
    """``Agent.set`` against the store's raw exchange. The writes go round 1,000 cells
    (updates), or with ``inserts`` each to a new row (one thread: the threads would
    write the same rows): an insert's event holds ABSENT (the C set untracks it from
    the garbage collector, which would keep it)."""
    cells = [("t", i if inserts else i % 1000, "c") for i in range(per_thread)]

    def in_threads(fn: object) -> None:
        workers = [threading.Thread(target=fn) for _ in range(threads)]  # type: ignore[arg-type]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def raw() -> int:
        store = MemoryStore()

        def write() -> None:
            ex = store.exchange
            for i, (t, r, c) in enumerate(cells):
                ex(t, r, c, i)
        in_threads(write)
        return threads * per_thread

    cpu: list[float] = []  # process CPU seconds of each captured run (writers + shipper)

    def captured() -> int:
        started = time.process_time()
        agent = Agent(MemoryStore(), NullSink())

        def write() -> None:
            set_ = agent.set
            if batch_size == 1:
                for i, (t, r, c) in enumerate(cells):
                    set_(t, r, c, i)
                return
            for start in range(0, per_thread, batch_size):
                with agent.batch():
                    for i in range(start, min(start + batch_size, per_thread)):
                        t, r, c = cells[i]
                        set_(t, r, c, i)
        in_threads(write)
        agent.close()  # includes shipping everything
        cpu.append(time.process_time() - started)
        return threads * per_thread

    label = "auto batch per write" if batch_size == 1 else f"batches of {batch_size}"
    if inserts:
        label += ", inserts"
    # Interleaved rounds, best of each: the machine is shared and its load drifts.
    rates = [(best_of(1, captured), best_of(1, raw)) for _ in range(3)]
    report(f"capture: Agent.set, {threads} thread(s), {label}", max(r for r, _ in rates),
           "MemoryStore.exchange", max(b for _, b in rates), "writes/s",
           "ratio >= 0.25" if batch_size == 1
           else "ratio >= 0.5" if batch_size == 100 else "information only")
    print(f"  CPU per write (writers + shipper, process time, best run): "
          f"{1e6 * min(cpu) / (threads * per_thread):.2f} us"
          f"{'  [pure Python: CDC_AGENT_NATIVE=0]' if not native_in_use() else ''}")


def make_log(events: int, batch_size: int, writers: int) -> list[object]:
    """An encoded log of ``events`` events from ``writers`` concurrent writers."""
    sink = MemorySink(keep_messages=True)
    write_overlapping_batches(Agent(MemoryStore(), sink), events, batch_size, writers)
    return sink.decoded_messages()  # type: ignore[return-value]


def bench_assembler(events: int, batch_size: int, writers: int) -> None:
    log = make_log(events, batch_size, writers)
    n_events = sum(len(r) for r in log if hasattr(r, "data"))

    def assemble() -> int:
        for _ in Assembler().changesets(log):  # type: ignore[arg-type]
            pass
        return n_events

    def decode_only() -> int:
        # Baseline: touching every event once in Arrow (the floor for any reader).
        total = 0
        for r in log:
            if hasattr(r, "data"):
                total += len(r.data.column("new").to_numpy(zero_copy_only=False))
        return total

    # The first pass pays one-time costs (the process's memory pools grow, pages fault
    # in): shown apart; a consumer that runs for long goes at the warm rate.
    first = best_of(1, assemble)
    rate = best_of(3, assemble)
    goal = "1,000,000" if batch_size > 1 else "500,000"
    print(f"assembler: {n_events:,} events, batches of {batch_size}, {writers} writers: "
          f"{rate:,.0f} events/s on one core, warm (goal >= {goal}); "
          f"first pass {first:,.0f}")
    report("  assembler vs reading the values column once", rate,
           "read", best_of(3, decode_only), "events/s", "information only")


def bench_sha3_lanes(events: int, batch_size: int, writers: int) -> None:
    """The assembler on one log, its setsum items hashed four at a time (AVX2) against
    one at a time (where longer items go to hashlib): interleaved rounds."""
    native = sequencer.NATIVE
    if native is None or native.sha3_lanes() != 4:
        print("assembler, SHA3 four at a time: not in use here (CDC_AGENT_SHA3_X4=0, no "
              "AVX2, or no C extension)")
        return
    log = make_log(events, batch_size, writers)
    n_events = sum(len(r) for r in log if hasattr(r, "data"))

    def assemble(lanes: int) -> Callable[[], int]:
        def work() -> int:
            old = native.sha3_lanes(lanes)
            try:
                for _ in Assembler().changesets(log):  # type: ignore[arg-type]
                    pass
            finally:
                native.sha3_lanes(old)
            return n_events
        return work

    rates = [(best_of(1, assemble(4)), best_of(1, assemble(1))) for _ in range(5)]
    report(f"  assembler, batches of {batch_size}: SHA3 x4", max(r for r, _ in rates),
           "x1", max(b for _, b in rates), "events/s", "information only")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--assembler-only", action="store_true")
    args = parser.parse_args()
    if sequencer.NATIVE is not None:  # CDC_AGENT_SHA3_X4=0: one at a time, to compare
        print(f"SHA3 (setsum items): {sequencer.NATIVE.sha3_lanes()} at a time")
    if args.assembler_only:
        bench_assembler(args.events, 20, 4)
        bench_assembler(args.events // 8, 1, 1)
        bench_sha3_lanes(args.events, 20, 4)
        bench_sha3_lanes(args.events // 8, 1, 1)
        return
    bench_ids(300_000)
    for threads in (1, 4):
        bench_capture(threads, 100_000 // threads, 100)
        bench_capture(threads, 20_000 // threads, 1)
    bench_capture(1, 100_000, 100, inserts=True)
    bench_capture(1, 50_000, 10)  # small batches: each batch's open and close weigh more
    bench_assembler(args.events, 20, 4)
    bench_assembler(args.events // 8, 1, 1)
    bench_sha3_lanes(args.events, 20, 4)
    bench_sha3_lanes(args.events // 8, 1, 1)


if __name__ == "__main__":
    main()
