"""Fetch-ahead for remote shards: while the readers work through one shard, the next ones are copied into the cache.

Without it a loader worker that reaches a shard not yet cached waits for the whole copy (measured: the first
epoch over HTTP ran at 0.91 of local shards, docs/performance.md#tar-shards-issue-32). The batch sampler knows
the order in which the epoch reads the shards before any reader does, so the process that deals the batches runs
a :class:`FetchAhead` per epoch: a few threads copy the remote shards in the order the epoch first needs them,
none more than ``ahead`` shards beyond the one the sampler is dealing from (so the cache holds a bounded number of
shards not yet read). Where one shuffle window spans every shard (a small data set), every shard is needed in the
first batches: the threads then copy them side by side with the readers, which find the copies under way.

Readers and the threads share the cache's locks. A reader that needs a shard a thread is copying waits for that
copy (it began earlier than the reader's own would); a thread that finds a shard locked leaves it to whoever holds
it and takes the next one, so fetching ahead never holds a reader up.

It is only an optimisation: a fetch that fails here stops every thread and is left to the reader, which reports the
failure as it always does (nothing is skipped or hidden).
"""
from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Sequence

log = logging.getLogger("paddletrain")

# Copies under way at once, at most (fewer when ``ahead`` allows fewer): a server that holds each response to a rate
# (object stores do, per connection) serves several side by side; a link that is the limit shares itself among them.
THREADS = 4


class FetchAhead:
    """Calls ``fetch(shard)`` for each of ``shards`` (in the order the epoch first reads them; ``first_needed`` is
    the position of each one's first sample among the samples being dealt, ascending) from ``threads`` daemon
    threads, none more than ``ahead`` shards beyond the one the dealer has reached (:meth:`advance`).

    ``fetch`` returns without copying when someone else is copying the shard already."""

    def __init__(self, fetch: Callable[[int], object], shards: Sequence[int], first_needed: Sequence[int],
                 ahead: int, threads: int = THREADS) -> None:
        if len(shards) != len(first_needed):
            raise ValueError("one first position per shard")
        self._fetch = fetch
        self._shards = [int(s) for s in shards]
        self._first = [int(p) for p in first_needed]
        self._ahead = max(0, int(ahead))
        self._dealt = 0
        self._next = 0  # the next shard (its number in fetch order) a thread takes
        self._stopped = False
        self._changed = threading.Condition()
        self._threads = [threading.Thread(target=self._run, name="paddletrain-fetch-ahead", daemon=True)
                         for _ in range(min(max(1, threads), len(self._shards)))]
        for thread in self._threads:
            thread.start()

    def advance(self, dealt: int) -> None:
        """``dealt`` samples have been handed to the readers so far (the batch being dealt included)."""
        with self._changed:
            self._dealt = int(dealt)
            self._changed.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Stop fetching further shards; wait up to ``timeout`` seconds (in all) for copies under way to end."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @property
    def running(self) -> bool:
        """Whether any thread is still copying or waiting to."""
        return any(thread.is_alive() for thread in self._threads)

    def _reached(self) -> int:
        """The number (in fetch order) of the shard the dealer is in: the last one whose first sample is dealt
        (-1 before the first batch)."""
        return bisect.bisect_right(self._first, self._dealt - 1) - 1

    def _take(self) -> int | None:
        """The next shard to copy, once the dealer is near enough; None when there is none or fetching stopped."""
        with self._changed:
            while not self._stopped and self._next < len(self._shards) and \
                    self._next > self._reached() + self._ahead:
                self._changed.wait()
            if self._stopped or self._next >= len(self._shards):
                return None
            self._next += 1
            return self._shards[self._next - 1]

    def _run(self) -> None:
        while (shard := self._take()) is not None:
            try:
                self._fetch(shard)
            except Exception as exc:  # noqa: BLE001 - the reader fetches it again and says what is wrong
                log.debug("fetch-ahead of shard %d stopped: %s", shard, exc)
                with self._changed:
                    self._stopped = True
                    self._changed.notify_all()
                return
