"""Capture with Prometheus metrics on vs off: ``python3 -m bench.metrics``.

The same writes through an ``Agent`` on a MemoryStore into a sink that drops records
(capture and shipping, not a destination), once without metrics and once with a
``CaptureMetrics`` scraped by another thread every ``--scrape-every`` seconds (default
1: fifteen times as often as Prometheus' default interval). Runs alternate, best of
``--runs``; the goal is a ratio within noise of 1.
"""

from __future__ import annotations

import argparse
import functools
import threading

from agent import Agent, CaptureMetrics, MemoryStore
from bench._util import best_of, report
from bench.core import NullSink


def _capture(metrics: CaptureMetrics | None, threads: int, per_thread: int,
             batch_size: int, scrape_every: float) -> int:
    agent = Agent(MemoryStore(), NullSink(), metrics=metrics)
    stop = threading.Event()
    scraper = None
    if metrics is not None:
        from prometheus_client import generate_latest

        def scrape() -> None:
            while not stop.wait(scrape_every):
                generate_latest(metrics.registry)

        scraper = threading.Thread(target=scrape)
        scraper.start()

    def write(offset: int) -> None:
        set_ = agent.set
        if batch_size == 1:
            for i in range(per_thread):
                set_("t", offset + i % 1000, "c", i)
            return
        for start in range(0, per_thread, batch_size):
            with agent.batch():
                for i in range(start, min(start + batch_size, per_thread)):
                    set_("t", offset + i % 1000, "c", i)

    workers = [threading.Thread(target=write, args=(n * 1000,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    agent.close()  # includes shipping everything
    stop.set()
    if scraper is not None:
        scraper.join()
    return threads * per_thread


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writes", type=int, default=100_000, help="writes per thread")
    parser.add_argument("--runs", type=int, default=7, help="best of this many runs")
    parser.add_argument("--scrape-every", type=float, default=1.0, metavar="SECONDS",
                        help="how often a thread scrapes the metrics meanwhile")
    args = parser.parse_args(argv)
    for threads, batch_size in ((1, 1), (1, 100), (4, 100)):
        rates: dict[str, float] = {"off": 0.0, "on": 0.0}
        for _ in range(args.runs):  # alternate, so drift on the machine hits both
            for name in ("off", "on"):
                metrics = CaptureMetrics() if name == "on" else None
                rate = best_of(1, functools.partial(_capture, metrics, threads, args.writes,
                                                    batch_size, args.scrape_every))
                rates[name] = max(rates[name], rate)
        label = "auto batch per write" if batch_size == 1 else f"batches of {batch_size}"
        report(f"capture, metrics on: {threads} thread(s), {label}", rates["on"],
               "off", rates["off"], "writes/s", "within noise of 1")


if __name__ == "__main__":
    main()
