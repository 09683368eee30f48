"""Fetch-ahead of remote shards: copied into the cache before a reader needs them, once each, never hiding a failure."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from paddletrain.data import build_loader
from paddletrain.data.errors import SourceUnavailableError
from paddletrain.data.shards.pack import pack
from paddletrain.data.shards.prefetch import FetchAhead
from tests.conftest import compose_fit, datasets_of, write_image_folder
from tests.http_shards import FaultyServer


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_it_stays_the_given_number_of_shards_ahead_of_the_dealer():
    calls: list[int] = []
    ahead = FetchAhead(calls.append, shards=[5, 3, 7, 1], first_needed=[0, 4, 8, 12], ahead=1)
    try:
        assert wait_for(lambda: calls == [5])  # nothing dealt yet: the first shard, and one beyond it
        ahead.advance(4)  # samples 0-3 dealt: the dealer is in shard 5, so shard 3 is one beyond
        assert wait_for(lambda: calls == [5, 3])
        time.sleep(0.1)
        assert calls == [5, 3]  # shard 7 is two shards beyond: not yet
        ahead.advance(8)  # the dealer reached shard 3
        assert wait_for(lambda: calls == [5, 3, 7])
        ahead.advance(16)  # shard 1's first samples are dealt already: still copied (its reader may be at it)
        assert wait_for(lambda: calls == [5, 3, 7, 1])
    finally:
        ahead.close(timeout=5)
    assert not ahead.running


def test_it_copies_several_shards_at_once_each_once_within_its_threads_and_its_bound():
    under_way: list[int] = []
    done: list[int] = []
    most = [0]
    release = threading.Event()
    lock = threading.Lock()

    def fetch(shard: int) -> None:
        with lock:
            under_way.append(shard)
            most[0] = max(most[0], len(under_way))
        release.wait(10)
        with lock:
            under_way.remove(shard)
            done.append(shard)

    # One window over six shards: every shard's first sample is in the first batch; three threads.
    ahead = FetchAhead(fetch, shards=[4, 0, 5, 1, 3, 2], first_needed=[0, 1, 2, 3, 4, 5], ahead=8, threads=3)
    try:
        ahead.advance(64)
        assert wait_for(lambda: len(under_way) == 3)
        time.sleep(0.1)
        assert sorted(under_way) == [0, 4, 5]  # the first three the epoch needs, and no fourth beside them
        release.set()
        assert wait_for(lambda: len(done) == 6)
    finally:
        ahead.close(timeout=5)
    assert sorted(done) == [0, 1, 2, 3, 4, 5] and most[0] == 3 and not ahead.running
    # Windows of one shard, the dealer in the first: four threads, but only one shard beyond it may be copied.
    release.clear()
    done.clear()
    most[0] = 0
    ahead = FetchAhead(fetch, shards=[0, 1, 2, 3], first_needed=[0, 100, 200, 300], ahead=1, threads=4)
    try:
        ahead.advance(64)
        assert wait_for(lambda: len(under_way) == 2)
        time.sleep(0.1)
        assert sorted(under_way) == [0, 1]
        release.set()
        assert wait_for(lambda: done == [0, 1] or done == [1, 0])
        time.sleep(0.1)
        assert sorted(done) == [0, 1]  # 2 and 3 wait for the dealer
    finally:
        ahead.close(timeout=5)
    assert most[0] == 2


def test_a_failed_fetch_stops_every_thread_and_closing_stops_the_waiting():
    def fetch(shard: int) -> None:
        if shard == 3:
            raise OSError("server away")
        calls.append(shard)

    calls: list[int] = []
    failing = FetchAhead(fetch, shards=[5, 3, 7, 8, 9], first_needed=[0, 1, 2, 3, 4], ahead=1, threads=1)
    failing.advance(5)  # every shard may be copied
    assert wait_for(lambda: not failing.running)  # 3 failed: the thread stopped there
    assert calls == [5]  # 7, 8 and 9 are left to their readers
    taken: list[int] = []
    release = threading.Event()

    def slow_or_failing(shard: int) -> None:
        taken.append(shard)
        if shard == 3:
            raise OSError("server away")
        release.wait(10)

    # Two threads: one takes 3 and fails, the other takes 5 (or nothing, if the failure came first).
    failing = FetchAhead(slow_or_failing, shards=[3, 5, 7], first_needed=[0, 1, 2], ahead=1, threads=2)
    assert wait_for(lambda: failing._stopped)
    failing.advance(3)  # 7 is now within the bound
    release.set()  # the other thread's copy of 5 (if it took it) ends
    failing.close(timeout=5)
    assert 7 not in taken and not failing.running  # nothing more was taken once 3 had failed
    waiting = FetchAhead(calls.append, shards=[1, 2], first_needed=[0, 10], ahead=1)
    assert wait_for(lambda: 1 in calls)
    waiting.close(timeout=5)
    assert not waiting.running and 2 not in calls


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    write_image_folder(root)
    out = root / "shards"
    pack(root, out, shard_size_mb=10 / 1024, seed=0)  # 4 training shards of 4 images, 2 validation shards
    return out


def http_data(server: FaultyServer, cache: Path, *extra: str):
    cfg = compose_fit(["data=shards", f"data.urls='{server.url}/train-{{000000..000003}}.tar'",
                       f"data.val_urls='{server.url}/val-{{000000..000001}}.tar'", f"data.cache_dir={cache}",
                       "data.image_size=12", "data.batch_size=4", "data.num_workers=0", "data.shuffle_buffer=6",
                       *extra])
    return cfg, datasets_of(cfg)


def cached(cache: Path) -> int:
    return len(list(cache.glob("*.tar")))


def test_the_next_shards_are_in_the_cache_before_a_reader_asks_and_each_crosses_the_wire_once(shards, tmp_path):
    with FaultyServer(shards) as server:
        cfg, splits = http_data(server, tmp_path / "cache", "data.shuffle_buffer=1")  # one shard at a time
        loader = build_loader(splits.train, cfg.data, train=True, seed=0)
        shard_of = splits.train.shard_of
        touched = list(dict.fromkeys(shard_of(i) for i in loader.batch_sampler.epoch_indices()))
        assert len(touched) == 4
        dealt = iter(loader.batch_sampler)
        next(dealt)  # the first batch dealt (one shard of 4 images), and no image read yet
        cache = splits.train.cache
        copied = lambda: [shard for shard in touched if cache.entry(splits.train.urls[shard]).exists()]  # noqa: E731
        # The next two shards the epoch reads are copied; the last waits for the dealer.
        assert wait_for(lambda: set(touched[1:3]) <= set(copied()))
        time.sleep(0.1)
        assert touched[3] not in copied()
        next(dealt)  # the dealer reaches the second shard
        assert wait_for(lambda: touched[3] in copied())
        dealt.close()
        for _ in range(2):  # two epochs read through the loader: each shard crossed the wire once
            for _ in loader:
                pass
        fetched = {name: n for name, n in server.requests.items() if name.startswith("train-")}
        assert fetched == {f"train-00000{i}.tar": 1 for i in range(4)}


def test_fetch_ahead_off_copies_a_shard_only_when_a_reader_needs_it(shards, tmp_path):
    with FaultyServer(shards) as server:
        cfg, splits = http_data(server, tmp_path / "cache", "data.fetch_ahead=0")
        assert splits.train.fetch_ahead(list(range(16))) is None
        next(iter(build_loader(splits.train, cfg.data, train=True, seed=0)))
        time.sleep(0.2)
        assert cached(tmp_path / "cache") <= 2  # the shards of the first batch only


def test_a_shard_the_server_refuses_still_ends_the_read_in_the_readers_error(shards, tmp_path):
    with FaultyServer(shards) as server:
        cfg, splits = http_data(server, tmp_path / "cache")
        server.fail_status, server.failing = 404, {f"train-00000{i}.tar" for i in range(4)}
        loader = build_loader(splits.train, cfg.data, train=True, seed=0)
        with pytest.raises(SourceUnavailableError, match="404"):
            for _ in loader:
                pass
        assert wait_for(lambda: not any(t.name == "paddletrain-fetch-ahead" and t.is_alive()
                                        for t in threading.enumerate()))
