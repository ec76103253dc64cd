"""The router process's garbage collector, set once it is built, before it listens.

Everything built before the first request (modules, the config models, a `--snapshot` given: about 60,000
objects) lives as long as the process, yet every full collection walked it again: under wrk at concurrency
64 a full collection stopped the event loop for 70-150 ms on the shared 2-core machine, a pause every
request in flight waited out. `gc.freeze()` moves those objects out of the collector's sight. And at the
default young threshold (700 allocations) a collection ran every ~20 requests, each promoting the objects
of the requests then in flight, so the older generations filled and ran ever more often; a request's own
objects die by reference counting, so a larger young generation only delays the rare cycles.

What it costs: a frozen object that later becomes garbage inside a reference cycle (a `--snapshot`'s models,
once a newer snapshot replaces them) is never collected, at most what start-up built, once; and a cycle
made later lives up to 10,000 allocations longer.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_after_start"]

YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)


def settle_after_start() -> None:
    """Collect once, freeze what survives (start-up's long-lived objects) and widen the young generation."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
