"""comparisons/rated_server.py: the shard comparisons' loopback server, in a process of its own, held to a rate."""
from __future__ import annotations

import os
import time
import urllib.request

from comparisons.rated_server import serve, stop


def test_a_rated_server_holds_each_response_to_its_rate_from_a_process_of_its_own(tmp_path):
    (tmp_path / "blob").write_bytes(b"x" * 300_000)
    server, url = serve(tmp_path, mb_per_s=1.0)
    try:
        # Another process, as another machine's server: it does not hold this interpreter's lock while it sends.
        assert server.poll() is None and server.pid != os.getpid()
        started = time.perf_counter()
        body = urllib.request.urlopen(f"{url}/blob", timeout=10).read()
        seconds = time.perf_counter() - started
    finally:
        stop(server)
    assert len(body) == 300_000 and seconds >= 0.25  # 300 kB at 1 MB/s: 0.29 s at the least
    assert server.returncode is not None  # stopped


def test_an_unlimited_server_sends_as_fast_as_loopback_goes(tmp_path):
    (tmp_path / "blob").write_bytes(b"y" * 3_000_000)
    server, url = serve(tmp_path)
    try:
        started = time.perf_counter()
        body = urllib.request.urlopen(f"{url}/blob", timeout=10).read()
        seconds = time.perf_counter() - started
    finally:
        stop(server)
    assert body == b"y" * 3_000_000 and seconds < 2.0  # 3 MB held to nothing: far under the 3 s 1 MB/s would take
