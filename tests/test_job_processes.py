"""Process pools shut down without waiting: held until joined, and let go once their workers have ended."""
from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor

from paddletrain.job import processes


def _square(value: int) -> int:
    return value * value


def _pool_that_ran(value: int) -> ProcessPoolExecutor:
    pool = ProcessPoolExecutor(max_workers=1)
    assert pool.submit(_square, value).result() == value * value
    return pool


def test_pools_are_joined_on_the_way_out_and_an_ended_one_is_let_go(monkeypatch):
    monkeypatch.setattr(processes, "_POOLS_TO_JOIN", [])
    first = _pool_that_ran(3)
    processes.shut_down_later(first)
    [(held, first_thread, _workers)] = processes._POOLS_TO_JOIN
    assert held is first
    first_thread.join(timeout=30)  # its workers end on their own
    assert not first_thread.is_alive()

    second = _pool_that_ran(4)
    processes.shut_down_later(second)

    assert [held[0] for held in processes._POOLS_TO_JOIN] == [second]
    [(_, second_thread, _workers)] = processes._POOLS_TO_JOIN
    processes.join_pools()
    assert processes._POOLS_TO_JOIN == []
    assert not second_thread.is_alive()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_a_worker_still_busy_after_the_grace_period_is_killed(monkeypatch):
    monkeypatch.setattr(processes, "_POOLS_TO_JOIN", [])
    monkeypatch.setattr(processes, "POOL_JOIN_SECONDS", 0.5)
    pool = ProcessPoolExecutor(max_workers=1)
    pool.submit(_sleep, 0).result()  # the worker is up
    held = pool.submit(_sleep, 600)  # work that would hold the exit for ten minutes
    while not held.running():  # handed to the worker: shutting down no longer cancels it
        time.sleep(0.01)
    [worker] = pool._processes.values()
    processes.shut_down_later(pool)

    processes.join_pools()

    assert worker.exitcode == -9
