"""How paddletrain's processes stop: one owner of SIGTERM/SIGINT per process, and children that die with their parent.

:data:`stop_request` turns SIGTERM/SIGINT into a stop request. What a request does depends on where the process
is: before any work (the process is still importing) it exits at once; during start-up (building data, the model,
restoring a checkpoint) there is nothing to save, so the work is interrupted at once (``TrainingInterrupted``);
inside ``Trainer.fit`` the request is only recorded and the trainer stops after the current optimizer step
(saving a checkpoint when a checkpointing callback is present). A second signal, at least
:data:`REPEAT_WINDOW` seconds after the first, ends the process at once.

:func:`die_with_parent` asks Linux to signal a process when its parent dies (``PR_SET_PDEATHSIG``), so neither a
data-loader worker nor a rank outlives a ``kill -9`` of the process that started it.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from paddletrain.errors import DataWorkerLost, TrainingInterrupted

log = logging.getLogger("paddletrain")

# SIGUSR1 is SLURM's warning before a time limit (`#SBATCH --signal=USR1@90`, sent to every process of the job
# step, loader workers included): a stop like SIGTERM, and its default action would kill a process half-way.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# Set by paddletrain's launcher for the processes it starts: it announces signals and outcomes itself.
LAUNCHER_ENV = "PADDLETRAIN_LAUNCHER_PID"
# Set to its pid by a process that starts a command line of its own (a sweep's trials): the command stops, saving,
# when that process dies (:func:`hold_stop_signals_during_imports`).
STOP_WITH_PARENT_ENV = "PADDLETRAIN_STOP_WITH_PARENT"
# The same signal again within this many seconds is the same request delivered twice (e.g. `pkill` reaching a
# rank directly and through its launcher), not a user insisting.
REPEAT_WINDOW = 1.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL, parent_pid: int | None = None) -> bool:
    """Have this process receive ``signum`` when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``).

    ``parent_pid`` is the parent the caller expects; if the process has already been re-parented (the parent
    died before this call), ``signum`` is sent now. Without a ``parent_pid``, a parent of pid 1 means the same.
    Returns False where the call is not available (not Linux).
    """
    prctl = _prctl()
    if prctl is None or prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    # The parent may have died between fork and the prctl call: then no signal will ever come.
    parent = os.getppid()
    if (parent_pid is not None and parent != parent_pid) or (parent_pid is None and parent == 1):
        os.kill(os.getpid(), signum)
    return True


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (looked up once, in the parent: a forked worker inherits it), None outside Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def block_stop_signals() -> None:
    """Hold SIGTERM/SIGINT pending in this thread (and in processes it starts) until :meth:`StopRequest.install`.

    A launcher starts its children this way so a signal forwarded during their start-up waits for their handler
    instead of killing them half-started.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM/SIGINT pending while the block starts worker processes; they arrive after it.

    A forked worker starts with its parent's Python handlers; holding the signals until the worker has replaced
    them (:func:`ignore_stop_signals`) keeps a Ctrl-C in that window from running the parent's handler in it.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_stop_signals() -> None:
    """For helper processes (data-loader and decode workers): their parent decides when they stop.

    A Ctrl-C in a terminal reaches the whole foreground process group and ``pkill``/``timeout`` reach every
    process; a worker reacting on its own would print its own message or die under the parent mid-step.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class StopRequest:
    """The process's SIGTERM/SIGINT handler and the stop request it records (see the module docstring)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.received_at = 0.0
        self.installed = False
        # Log the "received" line. A rank started by paddletrain's launcher stays quiet: the launcher says it once.
        self.announce = True
        # What a request does now: "exit" (before any work: leave at once), "interrupt" (start-up work: raise
        # TrainingInterrupted) or "defer" (training: only record it; the trainer stops after the step).
        self._mode = "exit"
        self._plan = "stopping now (nothing to save yet)"
        self._previous: dict[int, Any] = {}
        # The "received" line of a request that arrived while a record was being written: said by the next check.
        self._unsaid: str | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self, announce: bool = True) -> None:
        """Own SIGTERM/SIGINT from now on (main thread only); a signal held pending since start-up arrives now."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        self.announce = announce
        # Always (re)register: importing Paddle replaces the C-level SIGTERM handler with its crash reporter
        # while Python still lists ours.
        previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        if not self.installed:
            self._previous = previous
            self.installed = True
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def uninstall(self) -> None:
        """Give SIGTERM/SIGINT back to the handlers that were there before :meth:`install`."""
        if self.installed:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self.installed = False

    def reset(self) -> None:
        self.signum = None
        self.received_at = 0.0
        self._unsaid = None

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Start-up work: a stop request (earlier or during the block) raises ``TrainingInterrupted`` at once."""
        with self._switch("interrupt", "stopping now (nothing to save yet)"):
            self.raise_if_requested()
            yield
            # The handler's raise can be swallowed where it lands (logging catches every Exception it meets while
            # writing a record): a request the block finished past still ends it.
            self.raise_if_requested()

    @contextlib.contextmanager
    def deferred(self, plan: str) -> Iterator[None]:
        """Work that stops at a safe point: a request is only recorded; ``plan`` says what happens next."""
        with self._switch("defer", plan):
            yield

    @contextlib.contextmanager
    def handling(self, plan: str) -> Iterator[None]:
        """:meth:`deferred`, installing the handlers for the block when nobody has (the Python-API ``Trainer``)."""
        owner = not self.installed
        if owner:
            self.reset()
            self.install()
        try:
            with self.deferred(plan):
                yield
        finally:
            if owner:
                self.uninstall()

    def raise_if_requested(self) -> None:
        self.say_unsaid()
        if self.signum is not None:
            raise TrainingInterrupted(self.signum)

    def say_unsaid(self) -> None:
        """Log the "received" line the handler could not write (the signal interrupted a log record): whoever
        checks the request next calls this, so a stop is always announced once."""
        if self._unsaid is not None:
            line, self._unsaid = self._unsaid, None
            (log.warning if self.announce else log.debug)("%s", line)

    @contextlib.contextmanager
    def _switch(self, mode: str, plan: str) -> Iterator[None]:
        saved = self._mode, self._plan
        self._mode, self._plan = mode, plan
        try:
            yield
        finally:
            self._mode, self._plan = saved

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.signum is not None:
            if now - self.received_at < REPEAT_WINDOW:
                return  # the same request, delivered twice
            log.error("Second %s: exiting immediately", name)
            exit_now(128 + signum)
        self.signum, self.received_at = signum, now
        in_logging = _inside_logging(frame)
        if self._mode == "interrupt" and not in_logging:
            # Whoever catches it says how the run ended, in one line. Inside logging it would be swallowed (and
            # printed as a logging error): the end of the interruptible block, or the next check, raises it.
            self.raise_if_requested()
        if self._mode == "exit":
            # Nothing has started yet (Hydra is composing the config): leave now. An exception raised inside
            # Hydra or OmegaConf would surface as a config error with their traceback.
            if self.announce:
                log.warning("%s received during start-up: exiting; nothing to save", name)
            exit_now(128 + signum)
        line = f"{name} received: {self._plan} (send it again to stop at once)"
        if in_logging:
            # A record is being written: writing another from here would re-enter the stream (a "reentrant call"
            # printed with its traceback as a logging error). The next check of the request says it.
            self._unsaid = line
            return
        (log.warning if self.announce else log.debug)("%s", line)


stop_request = StopRequest()


def _inside_logging(frame: Any) -> bool:
    """Whether the signal interrupted the logging module (its handlers catch every Exception and print it)."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] == "logging":
            return True
        frame = frame.f_back
    return False


def exit_now(code: int) -> None:
    """Leave without unwinding (no cleanup handlers run) after writing out what was logged."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe must not keep the process alive
            pass
    os._exit(code)


def hold_stop_signals_during_imports() -> None:
    """The first thing a command line's process does (standard library only, before Paddle loads).

    SIGTERM/SIGINT wait while Paddle and Hydra load (Paddle's import installs a crash reporter on SIGTERM that
    would kill the process half-started); :func:`own_stop_signals` then acts on them. A process started by
    ``paddle.distributed.launch`` (a rank) also stops, saving, when that launcher dies, and so does a command
    started with :data:`STOP_WITH_PARENT_ENV` set to its parent's pid (a sweep's trial) when that parent dies.
    """
    block_stop_signals()
    parent = os.environ.pop(STOP_WITH_PARENT_ENV, None)  # for this process only, not for those it starts
    if parent and parent.isdigit():
        die_with_parent(signal.SIGTERM, int(parent))
    elif "PADDLE_TRAINER_ID" in os.environ:
        die_with_parent(signal.SIGTERM)


def start_command_process() -> None:
    """The first lines of every command line's ``__main__``: :func:`hold_stop_signals_during_imports`, and
    Python warnings filtered and routed to the log before Paddle loads (``import paddle`` itself warns;
    :mod:`paddletrain.console` lists what is dropped and why)."""
    hold_stop_signals_during_imports()
    from paddletrain.console import install_warning_filters, route_warnings_to_log

    install_warning_filters()
    route_warnings_to_log()


def own_stop_signals() -> None:
    """After the imports: :data:`stop_request` handles SIGTERM/SIGINT; one that arrived meanwhile is handled now."""
    stop_request.install(announce=LAUNCHER_ENV not in os.environ)


def reclaim_stop_signals() -> None:
    """After a late ``import paddle`` (its import installs a crash reporter on SIGTERM at the C level, over ours):
    take SIGTERM/SIGINT back, when this process owns them (a command line's wrapper installed the handler)."""
    if stop_request.installed:
        stop_request.install(announce=stop_request.announce)


def call_with_worker_setup(init_fn: Callable[..., Any] | None, parent_pid: int) -> Callable[..., Any]:
    """A worker initialiser that ignores stop signals and dies with ``parent_pid``, then runs ``init_fn``."""
    _prctl()
    return _WorkerSetup(init_fn, parent_pid)


class _WorkerSetup:
    """Picklable initialiser for worker processes (see :func:`call_with_worker_setup`)."""

    def __init__(self, init_fn: Callable[..., Any] | None, parent_pid: int) -> None:
        self.init_fn = init_fn
        self.parent_pid = parent_pid

    def __call__(self, *args: Any) -> None:
        ignore_stop_signals()
        # SIGKILL: a worker holds nothing worth saving, and paddle's own parent watch misses a parent killed
        # while the worker blocks reading its queue (measured: workers alive minutes after `kill -9`).
        die_with_parent(signal.SIGKILL, self.parent_pid)
        if self.init_fn is not None:
            self.init_fn(*args)


# Paddle's words when a worker process dies: "DataLoader process (pid 123) exited is killed by signal: Killed".
_LOST_WORKER = re.compile(r"DataLoader (?:worker|process) \(pid\s*(\d+)\) exited is killed by signal: ([^\n.]+)")
_SIGNAL_NAMES = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}


def lost_worker(error: BaseException) -> DataWorkerLost | None:
    """Paddle's error for a loader worker that died, said in a person's terms (which worker, which signal, the
    likely cause); None for any other error."""
    found = _LOST_WORKER.search(str(error))
    if found is None:
        return None
    pid, said = found.group(1), found.group(2).strip()
    return worker_killed("a data loader worker", int(pid), _SIGNAL_NAMES.get(said, said),
                         "data.num_workers or data.batch_size")


def worker_killed(worker: str, pid: int, signal_name: str, smaller: str) -> DataWorkerLost:
    """The error for ``worker`` (pid ``pid``) killed by ``signal_name``, with its likely cause; ``smaller`` names
    the keys that use less memory."""
    if signal_name == "SIGKILL":
        cause = f"most likely by the out-of-memory killer: lower {smaller} (or free the machine's memory)"
    elif signal_name in ("SIGSEGV", "SIGBUS", "SIGABRT"):
        cause = ("it crashed, most likely decoding an image: `python -m paddletrain.data check` finds the files a "
                 "decoder fails on")
    else:
        cause = "by something outside this run"
    return DataWorkerLost(f"{worker} (pid {pid}) was killed by {signal_name}, {cause}")


class _WorkerWatch:
    """A loader worker's death, noticed by Paddle's SIGCHLD handler (which raises wherever the main thread happens
    to be: inside an optimizer step, a checkpoint's fsync) and kept here instead, to be raised where the state is
    whole: the Trainer's next step boundary (:func:`raise_if_worker_lost`) or the loader's next batch."""

    lost: DataWorkerLost | None = None
    installed = False
    # The main thread waits in a loader (a batch, persistent workers' reset): a death is raised there at once,
    # since Paddle may otherwise wait for the dead worker for ever; anywhere else it waits for a step boundary.
    in_loader = False

    @classmethod
    def install(cls) -> None:
        """Put the watch around Paddle's SIGCHLD handler (after Paddle set it; the main thread only)."""
        if cls.installed or threading.current_thread() is not threading.main_thread():
            return
        paddles = signal.getsignal(signal.SIGCHLD)
        if not callable(paddles):
            return

        def on_child_exit(signum: int, frame: Any) -> None:
            try:
                paddles(signum, frame)
            except SystemError as exc:
                lost = lost_worker(exc)
                if lost is None:
                    raise
                if cls.in_loader:
                    raise lost from None
                cls.lost = cls.lost or lost

        signal.signal(signal.SIGCHLD, on_child_exit)
        cls.installed = True


def watch_loader_workers() -> None:
    """Keep a loader worker's death for :func:`take_lost_worker` rather than let Paddle raise it anywhere (call
    once its multi-process loader has started, from the main thread)."""
    _WorkerWatch.install()


@contextlib.contextmanager
def waiting_in_loader() -> Iterator[None]:
    """While the main thread waits for a loader, a worker's death is raised at once (:class:`_WorkerWatch`)."""
    _WorkerWatch.in_loader, before = True, _WorkerWatch.in_loader
    try:
        yield
    finally:
        _WorkerWatch.in_loader = before


def take_lost_worker() -> DataWorkerLost | None:
    """The :class:`~paddletrain.errors.DataWorkerLost` of a loader worker that died since the last call, if any."""
    lost, _WorkerWatch.lost = _WorkerWatch.lost, None
    return lost


def raise_if_worker_lost() -> None:
    """Raise :func:`take_lost_worker`'s error, if there is one (the Trainer calls it at every step boundary)."""
    lost = take_lost_worker()
    if lost is not None:
        raise lost


# Process pools shut down without waiting (a caller that must not wait for its workers), each with its manager
# thread and its workers, joined before the interpreter shuts down: the interpreter's own join of that thread can
# fail on a closed descriptor and print a traceback after a command that succeeded. The pool is held too:
# collecting it wakes the thread through the same descriptor.
_POOLS_TO_JOIN: list[tuple[Any, threading.Thread, list[Any]]] = []
# How long the workers may take to finish the work they hold (one batch's decoding) before they are killed.
POOL_JOIN_SECONDS = 30.0


def shut_down_later(pool: Any) -> None:
    """Shut ``pool`` (a ``concurrent.futures.ProcessPoolExecutor``) down now without waiting: queued work is
    dropped and its workers exit on their own; :func:`join_pools` joins it. Pools already ended are let go here, so
    a long-lived process (a notebook predicting many times) does not hold every executor it ever used."""
    thread = pool._executor_manager_thread  # shutdown() forgets these; captured first
    workers = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    ended = [held for held in _POOLS_TO_JOIN if not held[1].is_alive()]
    _POOLS_TO_JOIN[:] = [held for held in _POOLS_TO_JOIN if held[1].is_alive()]
    for _pool, ended_thread, _workers in ended:
        _forget_wakeup(ended_thread)
    if thread is not None:
        _POOLS_TO_JOIN.append((pool, thread, workers))


def _forget_wakeup(thread: threading.Thread) -> None:
    """Python 3.11's exit hook wakes every executor thread it holds, through a pipe that may be closed by then
    ("Bad file descriptor"): a thread that has ended is taken out of its list."""
    wakeups = getattr(sys.modules.get("concurrent.futures.process"), "_threads_wakeups", None)
    if wakeups is not None:
        wakeups.pop(thread, None)


def join_pools() -> None:
    """Wait for the pools :func:`shut_down_later` was given (every command calls it on its way out); workers
    still busy after :data:`POOL_JOIN_SECONDS` are killed (they ignore SIGTERM, which is all a broken pool's
    thread sends them before it waits for them)."""
    while _POOLS_TO_JOIN:
        _pool, thread, workers = _POOLS_TO_JOIN.pop()
        thread.join(POOL_JOIN_SECONDS)
        if thread.is_alive():
            for worker in workers:
                if worker.exitcode is None:
                    worker.kill()
            thread.join()
        _forget_wakeup(thread)
