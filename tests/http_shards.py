"""A real HTTP server on loopback for the shard tests: serves a folder, honours ``Range``, and can be told to fail.

``FaultyServer(folder)`` serves ``folder`` on 127.0.0.1 (a free port) from a thread of the test process, with the
standard library's ``http.server``. Faults, set on the running server:

- ``drop_after``: ``{file name: byte}``: the response to a GET of that file is cut after that many bytes of the
  file (the connection closed mid-body), once per entry in ``drops_left`` (default: every time);
- ``fail_status``: answer every request with this status (500: a server error, retried; 404: refused at once), or
  only the requests for the names in ``failing`` when it is not empty;
- ``ignore_ranges``: answer a ``Range`` request with the whole file (200), as servers without range support do;
- ``corrupt``: ``{file name: offset}``: flip the byte at ``offset`` of that file in every response;
- ``drop_half``: cut every response to a GET after half of the bytes it was asked for (ranges included): True for
  every file, or a suffix (``".tar"``) for the files whose names end with it;
- ``bytes_per_second``: send bodies at about this rate (a slow server; 0: at once);
- ``fail_first``: ``{file name: n}``: answer the first n GETs of that file with 500, then serve it;
- ``hang_after``: ``{file name: byte}``: send that many bytes of the file, then stop answering (the connection
  stays open until the server shuts down).

``requests`` counts the GETs per file name, ``starts`` lists the first byte each GET asked for.
"""
from __future__ import annotations

import http.server
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FaultyServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (the base class's name)
        pass

    def _body(self) -> tuple[str, bytes] | None:
        name = self.path.split("?", 1)[0].lstrip("/")
        path = self.server.folder / name
        if "/" in name or not path.is_file():
            self.send_error(404)
            return None
        data = bytearray(path.read_bytes())
        if name in self.server.corrupt:
            data[self.server.corrupt[name]] ^= 0xFF
        return name, bytes(data)

    def _failing(self) -> bool:
        name = self.path.split("?", 1)[0].lstrip("/")
        return bool(self.server.fail_status) and (not self.server.failing or name in self.server.failing)

    def _served(self) -> tuple[str, bytes] | None:
        """The file asked for, or None once an error was sent (a fault set on the server, or no such file)."""
        if self._failing():
            self.send_error(self.server.fail_status)
            return None
        return self._body()

    def do_HEAD(self) -> None:  # noqa: N802
        found = self._served()
        if found is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(found[1])))
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        name = self.path.split("?", 1)[0].lstrip("/")
        if self.server.fail_first.get(name, 0) > 0:
            self.server.fail_first[name] -= 1
            self.server.requests[name] += 1
            self.send_error(500)
            return
        found = self._served()
        if found is None:
            return
        name, data = found
        self.server.requests[name] += 1
        start = 0
        wanted = self.headers.get("Range")
        if wanted and not self.server.ignore_ranges and wanted.startswith("bytes=") and wanted.endswith("-"):
            start = int(wanted[len("bytes="):-1])
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        body = data[start:]
        self.server.starts[name].append(start)
        cut, left = self.server.drop_after.get(name), self.server.drops_left.get(name)
        half = self.server.drop_half
        if half is True or (isinstance(half, str) and name.endswith(half)):  # every time, whatever drops_left says
            cut, left = start + max(1, (len(data) - start) // 2), None
        if cut is not None and cut > start and (left is None or left > 0):
            if left is not None:
                self.server.drops_left[name] = left - 1
            self.wfile.write(body[:cut - start])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if name in self.server.hang_after:
            self.wfile.write(body[:max(0, self.server.hang_after[name] - start)])
            self.wfile.flush()
            self.server.closing.wait()  # silent until the server shuts down
            return
        if self.server.bytes_per_second:
            step = max(1, self.server.bytes_per_second // 20)
            for at in range(0, len(body), step):
                self.wfile.write(body[at:at + step])
                self.wfile.flush()
                time.sleep(step / self.server.bytes_per_second)
            return
        self.wfile.write(body)


class FaultyServer(http.server.ThreadingHTTPServer):
    """``folder`` served on loopback; see the module docstring. Use as a context manager."""

    daemon_threads = True

    def __init__(self, folder: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.folder = Path(folder)
        self.drop_after: dict[str, int] = {}
        self.drops_left: dict[str, int] = {}
        self.fail_status = 0
        self.failing: set[str] = set()
        self.ignore_ranges = False
        self.corrupt: dict[str, int] = {}
        self.drop_half: bool | str = False
        self.fail_first: dict[str, int] = {}
        self.hang_after: dict[str, int] = {}
        self.closing = threading.Event()
        self.bytes_per_second = 0
        self.requests: Counter = Counter()
        self.starts: defaultdict[str, list[int]] = defaultdict(list)  # each GET's first byte, per file
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a connection the test cut on purpose is no error to print

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FaultyServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
