"""Run ``python -m <module> args`` in a process forked from a warm interpreter instead of a fresh one.

A fresh ``python -m paddletrain.fit`` spends about 2 s importing Paddle, Hydra and paddletrain before it does
anything, and the suite starts such commands a few hundred times. :func:`run_module` asks one server per test
process (started on first use, Paddle already imported, nothing run) to fork; the child sets the working
directory, the environment and ``sys.argv``, points file descriptors 0, 1 and 2 at ``/dev/null`` and two files,
and runs the module as ``python -m`` does (``runpy._run_module_as_main``). It then leaves the interpreter the normal
way (``sys.exit``: non-daemon threads joined, ``atexit`` handlers run, buffers flushed), so the exit status and
the output are those of a process, observed through real file descriptors.

What a fork cannot reproduce falls back to a fresh process: an environment that differs from the server's in a
variable read while importing (``PYTHON*``, ``FLAGS_*``, ``PADDLE_*``, ``OMP_*``, ``LD_*``, ...), an input on
stdin, or ``PADDLETRAIN_TEST_FRESH=1`` (every command fresh, to rule the server out).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# Variables read when Python, Paddle or OpenMP start, not later: a command given other values than the server
# started with needs a fresh interpreter.
_READ_AT_START = ("PYTHON", "FLAGS_", "PADDLE_", "GLOG_", "OMP_", "KMP_", "MKL_", "LD_", "CUDA_", "CUSTOM_DEVICE")
# Imported by the server before any fork: the third-party libraries fit, evaluate, export, ship and data import
# first (Paddle is most of the 2 s). No paddletrain module: a command imports its own, so one that forgets an
# import it needs fails here as it would for a user.
_WARM_IMPORTS = ("paddle", "hydra", "hydra.utils", "omegaconf", "PIL.Image", "numpy", "safetensors", "tqdm", "yaml")

_SERVER = r'''
import importlib, json, os, runpy, sys, traceback
before = dict(os.environ)
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
# what importing set in the environment (Paddle: OMP_NUM_THREADS=1 when unset), as a fresh import would again
set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
requests, replies = sys.stdin, sys.stdout
for line in requests:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ.update(set_by_imports)
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                                (2, request["stderr"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = [request["module"], *request["args"]]
        sys.path[0] = os.getcwd()  # as `python -m` puts it (the server's '' was resolved in its own directory)
        try:
            runpy._run_module_as_main(request["module"])
        except SystemExit:
            raise
        except BaseException:
            traceback.print_exc()
            sys.exit(1)
        sys.exit(0)
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
'''


class _Server:
    """One warm interpreter that forks a child per command, one command at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self._cwd = tempfile.mkdtemp(prefix="paddletrain-forked-")  # nothing importable by accident
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, ",".join(_WARM_IMPORTS)], cwd=self._cwd,
                                      env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def run(self, module: str, args: list[str], cwd, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        with self._lock, tempfile.TemporaryDirectory(prefix="paddletrain-forked-out-") as out:
            stdout, stderr = Path(out) / "stdout", Path(out) / "stderr"
            stdout.touch()
            stderr.touch()
            request = {"module": module, "args": list(args), "cwd": str(Path(cwd).resolve()), "env": env,
                       "stdout": str(stdout), "stderr": str(stderr)}
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            pid = self._reply(30)["pid"]
            reply = self._reply(timeout)
            if reply is None:
                os.kill(pid, signal.SIGKILL)
                self._reply(30)
                raise subprocess.TimeoutExpired([sys.executable, "-m", module, *args], timeout,
                                                stdout.read_text(errors="replace"), stderr.read_text(errors="replace"))
            return subprocess.CompletedProcess([sys.executable, "-m", module, *args], reply["returncode"],
                                               stdout.read_text(errors="replace"), stderr.read_text(errors="replace"))

    def _reply(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the forking server of tests/forked.py died")
        return json.loads(line)

    def close(self) -> None:
        if self.alive():
            self._proc.stdin.close()
            self._proc.wait(30)


_server: _Server | None = None


def server_pids() -> set[int]:
    """The forking server's process id, if it runs: a child of this process that a test counting its own
    children (loader workers) must leave out."""
    return {_server._proc.pid} if _server is not None and _server.alive() else set()


def _forkable(env: dict[str, str], server_env: dict[str, str]) -> bool:
    keys = {k for k in (*env, *server_env) if k.startswith(_READ_AT_START)}
    return all(env.get(k) == server_env.get(k) for k in keys)


def run_module(module: str, args: list[str], cwd, env: dict[str, str], timeout: float,
               server_env: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m module args`` in ``cwd`` with exactly the environment ``env``: forked from the warm server
    (started with ``server_env``) when ``env`` allows it (see the module's docstring), else in a fresh
    interpreter."""
    global _server
    if os.environ.get("PADDLETRAIN_TEST_FRESH") != "1":
        if _server is None or not _server.alive():
            _server = _Server(server_env)
            atexit.register(_server.close)
        if _forkable(env, _server.env):
            return _server.run(module, args, cwd, env, timeout)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
