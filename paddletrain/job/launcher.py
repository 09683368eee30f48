"""Supervise ``paddle.distributed.launch`` for ``python -m paddletrain.fit trainer.devices=N`` (and several nodes).

Paddle's launcher starts the ranks; this module is the process the user talks to, and owns four things:

- **Signals**: SIGTERM/SIGINT go to every rank directly, also to ranks still starting (they are started with the
  signals held pending until their handler is in place, so nothing is lost and nothing dies half-started).
  Paddle's launcher itself never sees them: it would signal the ranks three times in a row.
- **Lifetime**: Paddle's launcher dies with this process and every rank with Paddle's launcher, so ``kill -9``
  of the command you started leaves nothing behind (the ranks stop after their current step and save).
- **Console**: one line per rank started; the ranks' output goes to ``<log dir>/workerlog.N`` and this node's
  first rank is echoed here without Paddle's start-up chatter (:func:`shown_on_console`); Paddle's launcher's own
  messages (``LAUNCH INFO`` ...) go to ``<log dir>/launcher.log`` only.
- **Verdict**: one line naming the rank that failed and the same exit code a single process would have
  (:class:`~paddletrain.errors.ExitCode`), from the :class:`~paddletrain.job.distributed.RankOutcome` every rank
  leaves and, for a rank that could not leave one, from its log.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

from paddletrain.errors import ExitCode, describe_ranks
from paddletrain.job.distributed import OUTCOME_MARKER, RankOutcome, lost_peers
from paddletrain.job.processes import LAUNCHER_ENV, REPEAT_WINDOW, STOP_SIGNALS, exit_now, stop_request
from paddletrain.job.watchdog import Watchdog

log = logging.getLogger("paddletrain")

POLL_SECONDS = 0.2
# A stop that finds no rank to deliver to for this long (Paddle's launcher still starting, or waiting for other
# nodes) ends Paddle's launcher instead.
NO_RANK_GRACE = 3.0
# After Paddle's launcher ended, ranks still running (their launcher was killed) get this long to save and stop.
REAP_SECONDS = 60.0
FAILURE_CODES = (ExitCode.USER_ERROR, ExitCode.BAD_RESULT, ExitCode.UNEXPECTED, ExitCode.WORKER_LOST)

# Paddle's launcher, made to die with this process first (it has no option for that).
_BOOTSTRAP = ("import runpy, signal, sys; from paddletrain.job.processes import die_with_parent; "
              "die_with_parent(signal.SIGKILL, int(sys.argv.pop(1))); "
              "runpy.run_module('paddle.distributed.launch', run_name='__main__', alter_sys=True)")


@dataclass
class JobOutcome:
    """The job's exit code and the one line that says how it ended."""

    code: int
    message: str


@dataclass
class NodeSpec:
    """Where this launcher's processes sit in the job: ``nproc`` ranks on node ``node_rank`` of ``nnodes``."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    master: str | None = None

    def global_ranks(self) -> list[int]:
        return [self.node_rank * self.nproc + i for i in range(self.nproc)]


def decide(spec: NodeSpec, outcomes: dict[int, RankOutcome], ended_without_outcome: dict[int, str],
           stop_signum: int | None, launcher_code: int | None, launcher_log: Path,
           endpoints: list[str] | None = None, exit_codes: dict[int, int] | None = None) -> JobOutcome:
    """The job's outcome as seen from this node.

    ``outcomes``: what ranks reported; ``ended_without_outcome``: this node's ranks that left none, with their
    log since the start (a rank killed, or aborted inside a collective); ``endpoints``: every rank's address;
    ``exit_codes``: the status Paddle's launcher reported for a rank (:func:`first_failed_rank`).
    A real failure (bad input, diverged, unexpected) wins; then a stop this launcher forwarded; then a lost rank;
    then a stop that came from elsewhere (another node's rank received the signal).
    """
    failures = sorted((o for o in outcomes.values() if o.code in FAILURE_CODES), key=lambda o: o.time)
    if failures:
        first = failures[0]
        return JobOutcome(first.code, f"[rank {first.rank}] failed ({ExitCode.describe(first.code)}): {first.message}")
    interrupted = sorted((o for o in outcomes.values() if o.code >= 128), key=lambda o: o.rank)
    if stop_signum is not None:
        name = signal.Signals(stop_signum).name
        detail = (interrupted[0].message if interrupted else
                  f"Stopped by {name} before training started; nothing to save")
        return JobOutcome(ExitCode.interrupted(stop_signum), detail)
    lost = _lost_rank_line(outcomes, ended_without_outcome, endpoints, exit_codes or {})
    if lost is not None:
        return JobOutcome(ExitCode.RANK_LOST, lost)
    if interrupted:
        return JobOutcome(interrupted[0].code, interrupted[0].message)
    if launcher_code == 0 and all(outcomes.get(r, None) is None or outcomes[r].code == 0
                                  for r in spec.global_ranks()):
        return JobOutcome(ExitCode.OK, "")
    return JobOutcome(ExitCode.UNEXPECTED, f"Paddle's launcher failed (exit {launcher_code}) without a rank "
                                           f"reporting why; see {launcher_log}")


def _lost_rank_line(outcomes: dict[int, RankOutcome], silent: dict[int, str],
                    endpoints: list[str] | None, exit_codes: dict[int, int]) -> str | None:
    """One line naming the rank that was lost and who noticed, or None when no rank was lost."""
    noticed = {o.rank: o.lost_ranks or [] for o in outcomes.values() if o.code == ExitCode.RANK_LOST}
    vanished = []
    for rank_id, log_text in silent.items():
        peers = lost_peers(log_text, endpoints or [], rank_id)
        if peers:
            noticed[rank_id] = peers  # aborted inside Paddle after losing that peer
        else:
            vanished.append(rank_id)
    if not noticed and not vanished:
        return None
    parts = [f"{describe_ranks([r])} ended without a report ("
             f"{ExitCode.describe(exit_codes[r]) if r in exit_codes else 'killed, or crashed inside Paddle'}; "
             "see its workerlog)" for r in sorted(vanished)]
    for rank_id, peers in sorted(noticed.items()):
        if peers and set(peers) <= set(vanished):
            parts.append(f"rank {rank_id} stopped because it lost contact with {describe_ranks(peers)}")
        else:
            parts.append(f"rank {rank_id} lost contact with {describe_ranks(peers) if peers else 'another rank'} "
                         "(killed, crashed or its machine is unreachable)")
    return "; ".join(parts)


# Paddle's launcher's report of the first rank of its pod that failed (it reports only that one).
_FAILED_CONTAINER = re.compile(r"Container rank (\d+) status failed .* code (-?\d+) log ")


def first_failed_rank(launcher_text: str, spec: NodeSpec) -> tuple[int, int] | None:
    """``(global rank, exit status)`` of the rank Paddle's launcher saw fail first on this node (a negative status:
    killed by that signal), from its log; None when it reported none."""
    found = _FAILED_CONTAINER.search(launcher_text)
    if found is None:
        return None
    return spec.node_rank * spec.nproc + int(found.group(1)), int(found.group(2))


def _endpoints(log_dir: Path) -> list[str] | None:
    """Every rank's ``host:port`` (``PADDLE_TRAINER_ENDPOINTS``), from the environment Paddle saved for a rank."""
    for path in sorted(log_dir.glob("backup_env.*.json")):
        try:
            value = json.loads(path.read_text()).get("PADDLE_TRAINER_ENDPOINTS", "")
        except (OSError, ValueError):
            continue
        if value:
            return [e for e in value.split(",") if e]
    return None


# Paddle's INFO-level glog lines (``I1123 13:37:58.563987  3622 tcp_store.cc:336] ...``: the collective store
# connecting). Warnings and errors (W..., E..., F...) stay on the console.
_GLOG_INFO = re.compile(r"I\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
# Paddle's banner listing the FLAGS its launcher set for the rank: a header, one FLAGS(...) line each, a rule.
_FLAGS_BANNER = re.compile(r"=+ Modified FLAGS detected =+")
_RULE = re.compile(r"=+")


def shown_on_console(line: str, in_banner: bool = False) -> tuple[bool, bool]:
    """Whether a line of a rank's log is echoed to the console, and whether a FLAGS banner continues after it.

    Left out (they stay in the rank's workerlog): the rank's outcome line (the launcher's verdict says it),
    Paddle's INFO-level glog lines and its banner of modified FLAGS.
    """
    if in_banner:
        return False, not _RULE.fullmatch(line.strip())
    if _FLAGS_BANNER.fullmatch(line.strip()):
        return False, True
    return OUTCOME_MARKER not in line and not _GLOG_INFO.match(line), False


class _LogTail:
    """Copies the new lines of a rank's log to the console, as :func:`shown_on_console` decides."""

    def __init__(self, path: Path, out: TextIO) -> None:
        self.path = path
        self.out = out
        self.offset = path.stat().st_size if path.exists() else 0  # Paddle appends: skip earlier runs' lines
        self.start = self.offset
        self._partial = ""
        self._in_banner = False

    def pump(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, errors="replace") as handle:
            handle.seek(self.offset)
            text = handle.read()
            self.offset = handle.tell()
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            shown, self._in_banner = shown_on_console(line, self._in_banner)
            if shown:
                self.out.write(line + "\n")
        self.out.flush()

    def text_since_start(self, limit: int = 20000) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, errors="replace") as handle:
            handle.seek(max(self.start, self.path.stat().st_size - limit))
            return handle.read()


class Launcher:
    """Run one node's share of a job under ``paddle.distributed.launch`` and report its outcome (module docstring)."""

    def __init__(self, spec: NodeSpec, log_dir: Path, plan: str = "stopping after the current step",
                 watchdog: Watchdog | None = None) -> None:
        self.spec = spec
        # Ends the job when the ranks stop making progress (paddletrain.job.watchdog); its line once it did.
        self.watchdog = watchdog
        self.stalled: str | None = None
        self._ended: dict[int, float] = {}  # global rank -> when this launcher first saw it gone
        self.log_dir = Path(log_dir)
        self.plan = plan
        self.stop_signum: int | None = None
        self._stop_at = 0.0
        self._ranks: dict[int, Any] = {}  # pid -> psutil.Process of the ranks seen
        self._rank_ids: dict[int, int] = {}  # pid -> global rank
        self._signalled: set = set()
        self._proc: subprocess.Popen | None = None

    def command(self, script: Path, args: Sequence[str]) -> list[str]:
        spec = self.spec
        cmd = [sys.executable, "-c", _BOOTSTRAP, str(os.getpid()), "--nproc_per_node", str(spec.nproc),
               "--log_dir", str(self.log_dir)]
        if spec.nnodes > 1:
            cmd += ["--nnodes", str(spec.nnodes), "--rank", str(spec.node_rank), "--master", str(spec.master)]
        return [*cmd, str(script), *args]

    def run(self, script: Path, args: Sequence[str]) -> JobOutcome:
        """Start the ranks, supervise them until they end, and return the job's outcome."""
        if stop_request.requested:  # a signal arrived before anything was started
            return JobOutcome(ExitCode.interrupted(stop_request.signum),
                              f"Stopped by {signal.Signals(stop_request.signum).name} before the ranks started; "
                              "nothing to save")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for old in self.log_dir.glob("outcome.*.json"):
            old.unlink()
        if self.watchdog is not None:
            self.watchdog.reset()
        # Paddle names the logs by local rank and appends to them: remember where this run's lines start.
        logs = [_LogTail(self.log_dir / f"workerlog.{i}", sys.stdout) for i in range(self.spec.nproc)]
        tail = logs[0]
        launcher_log = self.log_dir / "launcher.log"
        launcher_start = launcher_log.stat().st_size if launcher_log.exists() else 0  # it is appended to
        cmd = self.command(script, args)
        log.info("Launching %d process(es) on node %d of %d; logs in %s", self.spec.nproc, self.spec.node_rank,
                 self.spec.nnodes, self.log_dir)
        env = dict(os.environ, **{LAUNCHER_ENV: str(os.getpid())})
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            with open(launcher_log, "a") as launcher_out:
                # The ranks inherit the held signals through Paddle's launcher (see the module docstring).
                held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    self._proc = subprocess.Popen(cmd, stdout=launcher_out, stderr=subprocess.STDOUT, env=env,
                                                  start_new_session=True)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, held)
                if stop_request.requested:  # arrived while the handlers were changing hands
                    self._request_stop(stop_request.signum)
                self._supervise(tail)
            code = self._proc.returncode
            self._note_ended()
            self._reap(tail)
            tail.pump()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        outcomes = RankOutcome.read_all(self.log_dir)
        silent = {rank_id: logs[i].text_since_start() for i, rank_id in enumerate(self.spec.global_ranks())
                  if rank_id not in outcomes and logs[i].text_since_start()}
        with open(launcher_log, errors="replace") as handle:
            handle.seek(launcher_start)
            first_failed = first_failed_rank(handle.read(), self.spec)
        outcome = decide(self.spec, outcomes, silent, self.stop_signum, code, launcher_log, _endpoints(self.log_dir),
                         exit_codes=dict([first_failed]) if first_failed else None)
        return self._stall_verdict(outcome)

    # ------------------------------------------------------------------ supervision
    def _supervise(self, tail: _LogTail) -> None:
        last_rank_seen = time.monotonic()
        while True:
            alive = self._discover()
            if alive:
                last_rank_seen = time.monotonic()
            if self.stop_signum is not None:
                self._forward()
                idle = time.monotonic() - max(last_rank_seen, self._stop_at)
                if not alive and idle > NO_RANK_GRACE and self._proc.poll() is None:
                    self._proc.kill()  # still starting or waiting for other nodes: nothing to save
            self._note_ended()
            self._watch()
            tail.pump()
            if self._proc.poll() is not None:
                return
            time.sleep(POLL_SECONDS)

    def _discover(self) -> list[int]:
        """Pids of the ranks alive now (Paddle's launcher's children), remembering every rank ever seen."""
        try:
            children = psutil.Process(self._proc.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            if child.pid not in self._ranks:
                try:
                    rank_id = int(child.environ().get("PADDLE_TRAINER_ID", "-1"))
                except (psutil.Error, ValueError):
                    continue  # not started yet (or already gone): next poll
                if rank_id < 0:
                    continue
                self._ranks[child.pid] = child
                self._rank_ids[child.pid] = rank_id
                local = rank_id - self.spec.node_rank * self.spec.nproc
                log.info("Started rank %d (pid %d), log %s", rank_id, child.pid, self.log_dir / f"workerlog.{local}")
            alive.append(child.pid)
        return alive

    def _forward(self) -> None:
        for pid, process in self._ranks.items():
            if pid in self._signalled:
                continue
            try:
                process.send_signal(self.stop_signum)
            except psutil.Error:  # gone already
                pass
            self._signalled.add(pid)

    def _reap(self, tail: _LogTail) -> None:
        """Wait for ranks that outlived Paddle's launcher (it was killed), then kill what is left."""
        alive = [p for p in self._ranks.values() if _running(p)]
        deadline = time.monotonic() + REAP_SECONDS
        while alive and time.monotonic() < deadline:
            tail.pump()
            time.sleep(POLL_SECONDS)
            alive = [p for p in alive if _running(p)]
        for process in alive:
            log.error("rank %d (pid %d) did not stop within %.0f s: killing it", self._rank_ids[process.pid],
                      process.pid, REAP_SECONDS)
            try:
                process.kill()
            except Exception:  # it stopped meanwhile
                pass

    # ------------------------------------------------------------------ hangs (paddletrain.job.watchdog)
    def _watch(self) -> None:
        """Kill this node's ranks once the watchdog finds the job stalled: they are stuck where no signal handler
        runs (inside a collective), and the other nodes' watchdogs do the same with theirs."""
        if self.watchdog is None or self.stalled is not None or self.stop_signum is not None:
            return
        self.stalled = self.watchdog.poll()
        if self.stalled is None:
            return
        log.error("No progress for trainer.collective_timeout=%g s: stopping every rank", self.watchdog.timeout)
        for process in self._ranks.values():
            try:
                process.kill()
            except psutil.Error:  # gone already
                pass

    def _note_ended(self) -> None:
        now = time.monotonic()
        for pid, process in self._ranks.items():
            if self._rank_ids[pid] not in self._ended and not _running(process):
                self._ended[self._rank_ids[pid]] = now

    def _stall_verdict(self, outcome: JobOutcome) -> JobOutcome:
        """The watchdog's line when the job stalled. Also for a lost peer when the ranks that ended first were all
        waiting, not late: gloo gave up (after its fixed 30 s) on a peer that was alive, and the heartbeats say
        which. (A killed rank ends first, and its peers within the same poll.)"""
        if self.stalled is not None:
            return JobOutcome(ExitCode.TIMED_OUT, self.stalled)
        if outcome.code != ExitCode.RANK_LOST or self.watchdog is None or not self._ended:
            return outcome
        first = min(self._ended.values())
        ended_first = {rank_id for rank_id, at in self._ended.items() if at == first}
        stalled = self.watchdog.describe(ended_first)
        if stalled is None:
            return outcome
        return JobOutcome(ExitCode.TIMED_OUT, f"{stalled}; the collective's own timeout ended the wait")

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop_signum is not None:
            if time.monotonic() - self._stop_at < REPEAT_WINDOW:
                return
            log.error("Second %s: killing the ranks without saving", name)
            for process in self._ranks.values():
                try:
                    process.kill()
                except Exception:
                    pass
            if self._proc is not None:
                self._proc.kill()
            exit_now(ExitCode.interrupted(signum))
        log.warning("%s received: %s (send it again to stop at once)", name, self.plan)
        self._request_stop(signum)

    def _request_stop(self, signum: int) -> None:
        if self.stop_signum is None:
            self.stop_signum = signum
            self._stop_at = time.monotonic()


def _running(process: Any) -> bool:
    """Whether a psutil process still runs (a zombie waiting for its parent does not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
