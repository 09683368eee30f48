"""A loopback HTTP server for the shard comparisons, in a process of its own as another machine's server would be
(as a thread of the benchmark it would take the interpreter's lock from the loader it serves). Standard library
only, so the process starts in a fraction of a second.

``python -m comparisons.rated_server FOLDER MB_PER_S`` serves ``FOLDER`` on 127.0.0.1, each response held to
``MB_PER_S`` megabytes a second as a link to another machine or an object store's connection would hold it (0: as
fast as loopback goes), and prints its port on the first line of its output; :func:`serve` starts it, :func:`stop`
ends it.
"""
from __future__ import annotations

import http.server
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any


class RatedHandler(http.server.SimpleHTTPRequestHandler):
    # Bytes a second each response is held to (0: no limit); set per server by main().
    rate = 0.0

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def copyfile(self, source: Any, outputfile: Any) -> None:
        if not self.rate:
            super().copyfile(source, outputfile)
            return
        chunk, started, sent = 256 * 1024, time.perf_counter(), 0
        while block := source.read(chunk):
            outputfile.write(block)
            sent += len(block)
            ahead = sent / self.rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)


def serve(folder: Path, mb_per_s: float = 0.0) -> tuple[subprocess.Popen, str]:
    """Start the server on ``folder``: its process (end it with :func:`stop`) and its base URL."""
    process = subprocess.Popen([sys.executable, "-m", "comparisons.rated_server", str(folder), str(mb_per_s)],
                               stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    port = process.stdout.readline().strip()  # the server's first line; empty if it died first
    if not port.isdigit():
        process.kill()
        raise RuntimeError(f"the loopback HTTP server did not start (exit {process.wait()})")
    return process, f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen) -> None:
    """End a server that :func:`serve` started."""
    process.kill()
    process.wait()
    process.stdout.close()


def main(folder: str, mb_per_s: str) -> None:
    handler = type("_Rated", (RatedHandler,), {"rate": float(mb_per_s) * 1024**2})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=folder))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main(*sys.argv[1:3])
