"""The bounded, verified, least-recently-used cache of remote shards (paddletrain.data.shards.cache)."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time

import pytest

from paddletrain.data.errors import DatasetError
from paddletrain.data.shards.cache import ShardCache, ShardChecksumError
from paddletrain.data.shards.source import FetchPolicy
from tests.http_shards import FaultyServer

FAST = FetchPolicy(timeout=5, retries=2, deadline=10, backoff=0.01, backoff_max=0.05)


@pytest.fixture
def served(tmp_path):
    folder = tmp_path / "served"
    folder.mkdir()
    files = {}
    for i in range(4):
        data = os.urandom(100_000 + i)
        (folder / f"s-{i}.tar").write_bytes(data)
        files[f"s-{i}.tar"] = (data, hashlib.sha256(data).hexdigest())
    with FaultyServer(folder) as server:
        yield server, files


def test_a_shard_is_fetched_once_then_read_from_disk(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 10 << 20, FAST)
    data, digest = files["s-0.tar"]
    first = cache.path(f"{server.url}/s-0.tar", digest, len(data))
    second = cache.path(f"{server.url}/s-0.tar", digest, len(data))
    assert first == second and first.read_bytes() == data and first.parent == tmp_path / "cache"
    assert server.requests["s-0.tar"] == 1


def test_the_least_recently_used_shards_go_when_the_cap_is_reached(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 250_000, FAST)  # two shards fit, not three
    url = {name: f"{server.url}/{name}" for name in files}
    for name in ("s-0.tar", "s-1.tar"):
        cache.path(url[name])
    os.utime(cache.entry(url["s-0.tar"]), (time.time() - 100, time.time() - 100))  # s-0 used longest ago
    cache.path(url["s-1.tar"])
    cache.path(url["s-2.tar"])
    assert not cache.entry(url["s-0.tar"]).exists()
    assert cache.entry(url["s-1.tar"]).exists() and cache.entry(url["s-2.tar"]).exists()
    assert sum(size for _, size, _ in cache.entries()) <= 250_000


def test_a_fetch_under_way_counts_against_the_cap_at_the_size_it_will_reach(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 250_000, FAST)  # two shards fit, not three
    url = {name: f"{server.url}/{name}" for name in files}
    cache.path(url["s-0.tar"])
    # Another thread of this process is copying s-1: 10 bytes so far of the 100,001 its index says.
    entry = cache.entry(url["s-1.tar"])
    under_way = entry.with_name(f"{entry.name}.part.100001.{os.getpid()}")
    under_way.write_bytes(b"x" * 10)
    cache.path(url["s-2.tar"], files["s-2.tar"][1], 100_002)
    assert not cache.entry(url["s-0.tar"]).exists()  # s-0 made way for s-2 beside s-1's copy, counted whole
    assert under_way.exists() and cache.entry(url["s-2.tar"]).exists()  # a fetch under way is left alone


def test_an_open_copy_stays_readable_after_eviction(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 150_000, FAST)  # one shard at a time
    path = cache.path(f"{server.url}/s-0.tar")
    fd = os.open(path, os.O_RDONLY)
    try:
        cache.path(f"{server.url}/s-1.tar")  # evicts s-0
        assert not path.exists()
        assert os.pread(fd, 100, 500) == files["s-0.tar"][0][500:600]
    finally:
        os.close(fd)


def test_a_copy_that_does_not_match_its_index_is_refused_and_not_kept(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 10 << 20, FAST)
    data, digest = files["s-0.tar"]
    server.corrupt["s-0.tar"] = 1234
    with pytest.raises(ShardChecksumError, match=f"its index says {digest}"):
        cache.path(f"{server.url}/s-0.tar", digest, len(data))
    with pytest.raises(ShardChecksumError, match="more than the 99999 bytes its index says"):
        cache.path(f"{server.url}/s-0.tar", None, 99_999)
    assert list((tmp_path / "cache").glob("*.tar*")) == []
    server.corrupt.clear()
    assert cache.path(f"{server.url}/s-0.tar", digest, len(data)).read_bytes() == data


def test_a_shard_larger_than_the_cache_is_refused_naming_the_key(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 1000, FAST)
    with pytest.raises(DatasetError, match="data.cache_max_gb"):
        cache.path(f"{server.url}/s-0.tar", None, len(files["s-0.tar"][0]))


def _fetch_in_process(directory, url, digest, size, queue):
    queue.put(str(ShardCache(directory, 10 << 20, FAST).path(url, digest, size)))


def test_processes_sharing_a_cache_fetch_a_shard_once(served, tmp_path):
    server, files = served
    data, digest = files["s-3.tar"]
    server.drop_after["s-3.tar"] = 50_000  # slow enough for the others to arrive while the first fetches
    server.drops_left["s-3.tar"] = 1
    queue = multiprocessing.get_context("fork").Queue()
    workers = [multiprocessing.get_context("fork").Process(
        target=_fetch_in_process, args=(tmp_path / "cache", f"{server.url}/s-3.tar", digest, len(data), queue))
        for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    paths = {queue.get(timeout=5) for _ in workers}
    assert len(paths) == 1
    assert server.requests["s-3.tar"] == 2  # one fetch: its first response cut, its second continued it


def test_a_killed_fetch_leaves_no_half_shard(served, tmp_path):
    server, files = served
    cache = ShardCache(tmp_path / "cache", 10 << 20, FAST)
    entry = cache.entry(f"{server.url}/s-0.tar")
    stale = entry.with_name(entry.name + ".part.999999999")  # a fetch whose process is gone
    stale.write_bytes(b"half")
    cache.path(f"{server.url}/s-1.tar")
    assert not stale.exists()
    assert [p.name for p in (tmp_path / "cache").glob("*.tar")] == [cache.entry(f"{server.url}/s-1.tar").name]


def test_a_caller_that_will_not_wait_gets_nothing_while_another_copies_and_no_second_request(served, tmp_path):
    server, files = served
    data, digest = files["s-2.tar"]
    url = f"{server.url}/s-2.tar"
    server.bytes_per_second = 200_000  # the copy takes about half a second
    cache = ShardCache(tmp_path / "cache", 10 << 20, FAST)
    copied: list[object] = []
    reader = threading.Thread(target=lambda: copied.append(cache.path(url, digest, len(data))))
    reader.start()
    try:
        assert wait_for_request(server, "s-2.tar")
        started = time.monotonic()
        assert cache.path(url, digest, len(data), wait=False) is None  # the reader holds it: left to the reader
        assert time.monotonic() - started < 0.2
        assert cache.path(url, digest, len(data)) == cache.entry(url)  # waits for the reader's copy
    finally:
        reader.join(10)
    assert copied == [cache.entry(url)] and server.requests["s-2.tar"] == 1
    assert cache.path(url, digest, len(data), wait=False) == cache.entry(url)  # a copy there is returned at once


def wait_for_request(server: FaultyServer, name: str, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not server.requests.get(name):
        time.sleep(0.005)
    return bool(server.requests.get(name))
