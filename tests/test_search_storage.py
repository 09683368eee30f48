"""paddletrain.search.storage and the sweeper's hand-on of abandoned trials: the journal file of one machine, an
SQLite database with heartbeats, and a real PostgreSQL server (started by these tests) that several sweeps join."""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna", reason="the search extra (pip install paddletrain[search]) is not installed")

from paddletrain.errors import ConfigError  # noqa: E402
from paddletrain.search.storage import Heartbeat, claiming, open_storage, storage_url  # noqa: E402
from paddletrain.search.sweeper import SweepLock, requeue_abandoned, running, spent  # noqa: E402
from tests.conftest import TINY  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNNING, WAITING, FAIL = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING,
                          optuna.trial.TrialState.FAIL)
SPACE = {"optim.lr": optuna.distributions.FloatDistribution(0.01, 0.1)}


def _study(url: str, heartbeat: Heartbeat | None = None, name: str = "s") -> optuna.Study:
    return optuna.create_study(study_name=name, storage=open_storage(url, heartbeat), load_if_exists=True,
                               direction="maximize")


def _started_trial(study: optuna.Study, run_dir: str) -> optuna.Trial:
    trial = study.ask(SPACE)
    trial.set_user_attr("run_dir", run_dir)
    trial.report(0.5, step=0)
    return trial


def _handed_on(study: optuna.Study, original: optuna.Trial) -> None:
    """``original`` failed, and one waiting trial continues it: same parameters, run directory and reports."""
    trials = study.get_trials(deepcopy=False)
    assert trials[original.number].state == FAIL
    [waiting] = [t for t in trials if t.state == WAITING]
    assert waiting.params == original.params and waiting.user_attrs["run_dir"] == "/runs/trial_0000"
    assert waiting.intermediate_values == {0: 0.5}
    assert waiting.system_attrs["retry_history"] == [original.number]
    # the abandoned trial no longer counts against n_trials; its continuation is the next one asked
    assert spent(study) == 0 and running(study) == 0
    continued = study.ask(SPACE)
    assert continued.params == original.params and continued.user_attrs["run_dir"] == "/runs/trial_0000"


def test_a_journal_sweeps_running_trial_is_handed_on_once(tmp_path):
    url = storage_url(None, tmp_path)
    assert url == f"journal:{tmp_path.resolve() / 'study.journal'}"
    study = _study(url)
    original = _started_trial(study, "/runs/trial_0000")
    requeue_abandoned(study, running_are_abandoned=False)  # a sweep of this directory still runs it
    assert study.get_trials(deepcopy=False)[0].state == RUNNING
    requeue_abandoned(study, running_are_abandoned=True)
    requeue_abandoned(_study(url), running_are_abandoned=True)  # a second look finds nothing more to hand on
    _handed_on(_study(url), original)


def test_a_database_trial_whose_heartbeat_stopped_is_handed_on_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = _study(url, Heartbeat(interval=1, grace=2))
    original = _started_trial(study, "/runs/trial_0000")
    study._storage.record_heartbeat(original._trial_id)
    requeue_abandoned(study, running_are_abandoned=False)
    assert study.get_trials(deepcopy=False)[0].state == RUNNING  # alive: its heartbeat is fresh
    time.sleep(3)
    requeue_abandoned(study, running_are_abandoned=False)
    requeue_abandoned(_study(url, Heartbeat(interval=1, grace=2)), running_are_abandoned=False)
    _handed_on(study, original)


def test_one_sweep_holds_a_sweep_directory_and_the_next_takes_it_when_it_has_gone(tmp_path):
    first, second = SweepLock(tmp_path), SweepLock(tmp_path)
    assert first.take() and not second.take()
    first.release()
    assert second.take()
    second.release()


def test_a_storage_that_is_neither_a_url_nor_null_is_refused():
    with pytest.raises(ConfigError, match="hydra.sweeper.storage='study.db' is neither a database URL"):
        open_storage("study.db")


# ------------------------------------------------------------------------------------------- a real PostgreSQL


def _postgres_bin() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").is_file():
            return candidate
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_group(server: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signum)


@pytest.fixture(scope="module")
def postgres_server():
    """A PostgreSQL server of this module's own (trust authentication on loopback, no fsync), or a skip that says
    what is missing."""
    pytest.importorskip("psycopg", reason="psycopg (the search extra) is not installed")
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server on this machine (Debian's postgresql package; .ci/run installs it)")
    root = Path(tempfile.mkdtemp(prefix="paddletrain-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no `postgres` user to run the PostgreSQL server as")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    data = root / "data"
    init = subprocess.run([*run_as, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "paddletrain",
                           "--no-sync"], capture_output=True, text=True)
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"initdb could not create a PostgreSQL cluster: {init.stderr.strip()[-300:]}")
    server = subprocess.Popen([*run_as, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root),
                               "-h", "127.0.0.1", "-F", "-c", "max_connections=100"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            psycopg.connect(host="127.0.0.1", port=port, user="paddletrain", dbname="postgres").close()
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline or server.poll() is not None:
                _signal_group(server, signal.SIGKILL)
                shutil.rmtree(root, ignore_errors=True)
                pytest.skip("the PostgreSQL server did not start within 60 s")
            time.sleep(0.2)
    yield port
    # Fast shutdown, sent to the group: runuser (as root) does not hand SIGINT on, and the wait ran out each time.
    _signal_group(server, signal.SIGINT)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _signal_group(server, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def empty_database(postgres_server, request) -> str:
    """The URL of a new, empty database on the module's server."""
    import psycopg

    name = "study_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:40]
    with psycopg.connect(host="127.0.0.1", port=postgres_server, user="paddletrain", dbname="postgres",
                         autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name}")
        connection.execute(f"CREATE DATABASE {name}")
    return f"postgresql://paddletrain@127.0.0.1:{postgres_server}/{name}"


# Each process opens the storage at the same moment on the empty database and asks for one trial.
_JOIN_AT_ONCE = """
import sys, time
import optuna
from paddletrain.search.storage import Heartbeat, open_storage
url, start = sys.argv[1], float(sys.argv[2])
optuna.logging.set_verbosity(optuna.logging.WARNING)
time.sleep(max(0.0, start - time.time()))
study = optuna.create_study(study_name="joined", storage=open_storage(url, Heartbeat()), load_if_exists=True)
print(study.ask().number)
"""


def test_processes_that_open_an_empty_database_at_the_same_moment_share_one_study(empty_database):
    start = time.time() + 4  # after every interpreter has loaded Optuna
    processes = [subprocess.Popen([sys.executable, "-c", _JOIN_AT_ONCE, empty_database, str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT))) for _ in range(6)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-800:] for _, err in outputs]
    assert sorted(int(out) for out, _ in outputs) == list(range(6))  # one study, six different trials


def test_sweeps_sharing_a_journal_count_and_ask_in_turn(tmp_path):
    import itertools
    import threading

    url = storage_url(None, tmp_path)
    spans: list[tuple[float, float]] = []

    def claim() -> None:
        with claiming(url, "s"):
            began = time.monotonic()
            time.sleep(0.2)
            spans.append((began, time.monotonic()))

    threads = [threading.Thread(target=claim) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    spans.sort()
    assert len(spans) == 3 and all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    assert (tmp_path / "study.journal.claim.lock").exists()


def _sweep_command(sweep_dir: Path, url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "paddletrain.fit", "-m", *TINY, "hydra/sweeper=paddletrain_optuna",
            "hydra.sweeper.pruner=none", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
            "optim.lr=interval(0.01,0.1)", f"hydra.sweeper.storage={url}", "hydra.sweeper.study_name=shared",
            f"hydra.sweep.dir={sweep_dir}", *extra]


@pytest.mark.slow
def test_sweeps_on_two_machines_join_one_study_and_never_run_a_trial_twice(tmp_path, empty_database):
    """The same seeded command on two machines: with the seed alone, both drew the same values side by side."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    sweeps = [subprocess.Popen(_sweep_command(tmp_path / f"machine{i}", empty_database, "hydra.sweeper.n_trials=4",
                                              "hydra.sweeper.seed=7"), cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [sweep.communicate(timeout=900)[0] for sweep in sweeps]
    assert all(sweep.returncode == 0 for sweep in sweeps), [out[-2000:] for out in outputs]
    study = optuna.load_study(study_name="shared", storage=empty_database)
    trials = study.get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert len({t.params["optim.lr"] for t in trials}) == 4, [t.params for t in trials]
    run_dirs = sorted(p for i in range(2) for p in (tmp_path / f"machine{i}").glob("trial_*"))
    assert len(run_dirs) == 4 and {t.user_attrs["run_dir"] for t in trials} == {str(p) for p in run_dirs}
    for run_dir in run_dirs:  # each trial trained once: one run, never resumed or repeated
        summary = json.loads((run_dir / "summary.json").read_text())
        assert "resumed_from" not in summary and summary["epochs"] == 1


@pytest.mark.slow
def test_a_trial_of_a_machine_that_died_is_continued_by_another(tmp_path, empty_database):
    """Machine 0's sweep is killed in its first trial; machine 1's sweep, started after, finds the trial's
    heartbeat stale and continues it in the same (shared) run directory from its checkpoint."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    beat = ["hydra.sweeper.heartbeat_interval=1", "hydra.sweeper.grace_period=3", "hydra.sweeper.n_trials=1",
            "trainer.max_epochs=4"]
    first = subprocess.Popen(_sweep_command(tmp_path / "machine0", empty_database, *beat), cwd=tmp_path, env=env,
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "machine0" / "trial_0000" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (checkpoints.is_dir() and any(p.name.startswith("epoch")
                                                                            for p in checkpoints.iterdir())):
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    second = subprocess.run(_sweep_command(tmp_path / "machine1", empty_database, *beat), cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    trials = optuna.load_study(study_name="shared", storage=empty_database).get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].user_attrs["run_dir"] == str(tmp_path / "machine0" / "trial_0000")
    summary = json.loads((tmp_path / "machine0" / "trial_0000" / "summary.json").read_text())
    assert summary.get("resumed_from") and summary["epochs"] == 4
