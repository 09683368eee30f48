"""Fetch-ahead for remote shards: while the readers work through one shard, the next ones are copied into the cache.

Without it a loader worker that reaches a shard not yet cached waits for the whole copy (measured: the first
epoch over HTTP ran at 0.91 of local shards, docs/performance.md#tar-shards-issue-32). The batch sampler knows
the order in which the epoch reads the shards before any reader does, so the process that deals the batches runs
one :class:`FetchAhead` thread per epoch that copies each remote shard once the sampler is dealing from no more
than ``ahead`` shards before it. A shard whose first sample has been dealt already is left to its readers, which
copy the shards they need side by side: when one shuffle window spans every shard (a small data set), a single
thread fetching them in turn would only hold the readers up. Readers and this thread share the cache's locks: a
reader that needs a shard being fetched waits for that copy instead of starting its own.

It is only an optimisation: a fetch that fails here stops the thread and is left to the reader, which fetches the
shard itself and reports the failure as it always does (nothing is skipped or hidden).
"""
from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger("paddletrain")


class FetchAhead:
    """Calls ``fetch(shard)`` for each of ``shards`` (in the order the epoch first reads them; ``first_needed`` is
    the position of each one's first sample among the samples being dealt, ascending) in a daemon thread, at most
    ``ahead`` shards beyond the one the dealer has reached (:meth:`advance`)."""

    def __init__(self, fetch: Callable[[int], object], shards: Sequence[int], first_needed: Sequence[int],
                 ahead: int) -> None:
        if len(shards) != len(first_needed):
            raise ValueError("one first position per shard")
        self._fetch = fetch
        self._shards = [int(s) for s in shards]
        self._first = [int(p) for p in first_needed]
        self._ahead = max(0, int(ahead))
        self._dealt = 0
        self._stopped = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="paddletrain-fetch-ahead", daemon=True)
        self._thread.start()

    def advance(self, dealt: int) -> None:
        """``dealt`` samples have been handed to the readers so far (the batch being dealt included)."""
        with self._changed:
            self._dealt = int(dealt)
            self._changed.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop fetching further shards; wait up to ``timeout`` seconds for a copy under way to end."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join(timeout)

    def _reached(self) -> int:
        """The number (in fetch order) of the shard the dealer is in: the last one whose first sample is dealt
        (-1 before the first batch)."""
        return bisect.bisect_right(self._first, self._dealt - 1) - 1

    def _run(self) -> None:
        for number, shard in enumerate(self._shards):
            with self._changed:
                while not self._stopped and number > self._reached() + self._ahead:
                    self._changed.wait()
                if self._stopped:
                    return
                if self._first[number] < self._dealt:  # its readers have it in hand already
                    continue
            try:
                self._fetch(shard)
            except Exception as exc:  # noqa: BLE001 - the reader fetches it again and says what is wrong
                log.debug("fetch-ahead of shard %d stopped: %s", shard, exc)
                return
