"""Shard names and HTTP reads within bounds, against a real server on loopback (paddletrain.data.shards.source)."""
from __future__ import annotations

import io
import logging
import time

import pytest

from paddletrain.data.errors import DatasetError, SourceUnavailableError
from paddletrain.data.shards import source
from paddletrain.data.shards.source import (
    FetchPolicy,
    ShardFetchError,
    base_name,
    exists,
    expand_braces,
    expand_urls,
    fetch,
    read_bytes,
    sibling,
)
from tests.http_shards import FaultyServer

FAST = FetchPolicy(timeout=5, retries=3, deadline=20, backoff=0.01, backoff_max=0.05)


def test_brace_patterns_expand_as_webdataset_writes_them():
    assert expand_braces("/d/train-{000..002}.tar") == ["/d/train-000.tar", "/d/train-001.tar", "/d/train-002.tar"]
    assert expand_braces("s-{8..10}.tar") == ["s-8.tar", "s-9.tar", "s-10.tar"]
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert expand_braces("no-braces.tar") == ["no-braces.tar"]
    with pytest.raises(DatasetError, match="counts down"):
        expand_braces("x-{5..1}.tar")
    with pytest.raises(DatasetError, match="more than"):
        expand_braces("x-{0..99999999}.tar")


def test_url_lists_are_checked():
    assert expand_urls(["a-{0..1}.tar", "https://h/b.tar"], "data.urls") == ["a-0.tar", "a-1.tar", "https://h/b.tar"]
    with pytest.raises(DatasetError, match="data.urls names no shard"):
        expand_urls([], "data.urls")
    with pytest.raises(DatasetError, match="scheme 'ftp'"):
        expand_urls("ftp://h/a.tar", "data.urls")
    with pytest.raises(DatasetError, match="twice"):
        expand_urls(["a.tar", "a.tar"], "data.val_urls")
    assert base_name("https://h/d/train-000.tar?sig=1") == "train-000.tar"
    assert sibling("https://h/d/train-000.tar", "train.index.json") == "https://h/d/train.index.json"
    assert sibling("/d/train-000.tar", "train.index.json") == "/d/train.index.json"


@pytest.fixture
def served(tmp_path):
    payload = bytes(range(256)) * 4096  # 1 MiB, every offset's byte known
    (tmp_path / "shard.tar").write_bytes(payload)
    with FaultyServer(tmp_path) as server:
        yield server, payload


def test_a_whole_shard_is_copied(served):
    server, payload = served
    out = io.BytesIO()
    assert fetch(f"{server.url}/shard.tar", out, max_bytes=10 << 20, policy=FAST) == len(payload)
    assert out.getvalue() == payload and server.requests["shard.tar"] == 1


def test_a_connection_dropped_mid_shard_continues_from_the_byte_it_reached(served):
    server, payload = served
    server.drop_after["shard.tar"] = 300_000
    out = io.BytesIO()
    fetch(f"{server.url}/shard.tar", out, max_bytes=10 << 20, policy=FAST)
    assert out.getvalue() == payload
    assert server.starts["shard.tar"] == [0, 300_000]  # the second request asked for the rest only


def test_a_server_that_ignores_ranges_is_read_again_from_the_start(served):
    server, payload = served
    server.drop_after["shard.tar"] = 100_000
    server.drops_left["shard.tar"] = 1
    server.ignore_ranges = True
    out = io.BytesIO()
    fetch(f"{server.url}/shard.tar", out, max_bytes=10 << 20, policy=FAST)
    assert out.getvalue() == payload and server.requests["shard.tar"] == 2


def test_a_server_that_stays_away_ends_in_bounded_time_naming_the_url_and_the_byte(served):
    server, _ = served
    server.fail_status = 503
    started = time.monotonic()
    with pytest.raises(ShardFetchError) as error:
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=10 << 20, policy=FAST)
    assert time.monotonic() - started < 5
    assert f"{server.url}/shard.tar" in str(error.value) and "stopped at byte 0" in str(error.value)
    assert "4 attempts" in str(error.value) and "503" in str(error.value)
    assert isinstance(error.value, SourceUnavailableError)  # no bad-sample policy skips it


def test_a_drop_that_keeps_recurring_names_the_byte_reached(served):
    server, _ = served
    server.drop_after["shard.tar"] = 200_000  # every response is cut there, and each starts again at byte 0
    server.ignore_ranges = True
    with pytest.raises(ShardFetchError, match=r"stopped at byte 200000 of 1048576"):
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=10 << 20, policy=FAST)


def test_a_missing_file_is_refused_at_once_and_a_deadline_bounds_the_retries(served):
    server, _ = served
    started = time.monotonic()
    with pytest.raises(ShardFetchError, match="HTTP 404"):
        fetch(f"{server.url}/nothing.tar", io.BytesIO(), max_bytes=1 << 20, policy=FetchPolicy(backoff=5))
    assert time.monotonic() - started < 2
    server.fail_status = 500
    started = time.monotonic()
    with pytest.raises(ShardFetchError):
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=1 << 20,
              policy=FetchPolicy(timeout=1, retries=100, deadline=1.0, backoff=0.3))
    assert time.monotonic() - started < 3


def test_more_bytes_than_the_bound_are_refused(served):
    server, _ = served
    with pytest.raises(ShardFetchError, match="more than the bound"):
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=1000, policy=FAST)


def test_a_silent_server_times_out(tmp_path):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections and never answers
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/shard.tar"
        started = time.monotonic()
        with pytest.raises(ShardFetchError, match="timed out"):
            fetch(url, io.BytesIO(), max_bytes=1 << 20, policy=FetchPolicy(timeout=0.3, retries=1, backoff=0.01))
        assert time.monotonic() - started < 3
    finally:
        listener.close()


def test_small_files_are_read_locally_or_over_http(served, tmp_path):
    server, payload = served
    assert read_bytes(f"{server.url}/shard.tar", max_bytes=2 << 20, policy=FAST) == payload
    assert read_bytes(str(tmp_path / "shard.tar"), max_bytes=2 << 20) == payload
    with pytest.raises(ShardFetchError, match="more than"):
        read_bytes(str(tmp_path / "shard.tar"), max_bytes=10)
    assert exists(f"{server.url}/shard.tar", FAST) and not exists(f"{server.url}/other.tar", FAST)
    assert exists(str(tmp_path / "shard.tar")) and not exists(str(tmp_path / "other.tar"))


def test_each_retry_is_logged_at_most_once_a_shard_every_few_seconds(served, caplog):
    server, payload = served
    server.drop_after["shard.tar"] = 300_000
    server.drops_left["shard.tar"] = 1
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=10 << 20, policy=FAST)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shard server:")]
    assert lines == [f"shard server: reading {server.url}/shard.tar failed at byte 300000 of {len(payload)} "
                     f"(the connection closed before the end); attempt 2 of {FAST.retries + 1} in "
                     f"{FAST.backoff:.1f} s"]
    # A server that drops half-way every time, ranges included: attempts come fast, lines at most every 5 s.
    server.drop_half = True
    caplog.clear()
    source._said.clear()  # the line above was the last said about this URL
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="paddletrain"), pytest.raises(ShardFetchError) as error:
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=10 << 20,
              policy=FetchPolicy(retries=8, backoff=0.05, backoff_max=0.2))
    seconds = time.monotonic() - started
    said = [r for r in caplog.records if r.getMessage().startswith("shard server:")]
    assert 1 <= len(said) <= seconds / source.SAY_EVERY + 1
    assert "after 9 attempts" in str(error.value) and server.requests["shard.tar"] == 2 + 9


def test_a_slow_server_is_read_to_the_end_with_its_progress_seen(served, caplog, monkeypatch):
    server, payload = served
    monkeypatch.setattr(source, "SLOW_READ_SECONDS", 0.2)
    monkeypatch.setattr(source, "SAY_EVERY", 0.3)
    server.bytes_per_second = 1 << 20  # the 1 MiB shard in about a second: never cut, its progress logged
    out = io.BytesIO()
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        fetch(f"{server.url}/shard.tar", out, max_bytes=10 << 20, policy=FetchPolicy(timeout=2, retries=0))
    assert out.getvalue() == payload and server.requests["shard.tar"] == 1
    slow = [r.getMessage() for r in caplog.records if "slowly" in r.getMessage()]
    assert slow and all(f"reading {server.url}/shard.tar slowly, byte" in line and "KiB/s" in line for line in slow)


def test_a_server_error_then_success_is_retried_once_and_said(served, caplog):
    server, payload = served
    server.fail_first["shard.tar"] = 1
    out = io.BytesIO()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        fetch(f"{server.url}/shard.tar", out, max_bytes=10 << 20, policy=FAST)
    assert out.getvalue() == payload and server.requests["shard.tar"] == 2
    assert time.monotonic() - started < 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shard server:")]
    assert len(said) == 1 and "failed at byte 0 (OSError: HTTP 500" in said[0] and "attempt 2 of 4" in said[0]


def test_a_server_that_stops_answering_mid_read_is_timed_out_from_the_byte_reached(served, caplog):
    server, _ = served
    server.hang_after["shard.tar"] = 300_000
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="paddletrain"), \
            pytest.raises(ShardFetchError, match=r"stopped at byte 300000 of 1048576 after 2 attempts .*timed out"):
        fetch(f"{server.url}/shard.tar", io.BytesIO(), max_bytes=10 << 20,
              policy=FetchPolicy(timeout=0.5, retries=1, backoff=0.01))
    assert time.monotonic() - started < 5
    assert server.starts["shard.tar"] == [0, 300_000]  # the retry asked for the rest only
    assert any("failed at byte 300000 of 1048576" in r.getMessage() for r in caplog.records)
