"""SLURM (issue 21, part 2): the hostlist, the two conventions under srun, the errors for combinations that cannot
work, and the requeue on SIGUSR1, with SLURM's environment simulated for two tasks on loopback.

The tests that start real processes give each task the variables srun would (``SLURM_PROCID`` ...), a nodelist of
``localhost`` and a job id whose port (:func:`paddletrain.job.slurm.port_for_job`) is free, and put a fake
``scontrol`` first on ``PATH`` that records its arguments.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from paddletrain.checkpoint import find_latest, load_checkpoint
from paddletrain.config import TrainerConfig
from paddletrain.errors import ConfigError, ExitCode, UserError
from paddletrain.job import slurm
from paddletrain.job.launcher import NodeSpec
from paddletrain.validation import validate_config
from tests.conftest import TINY, compose_fit, run_module
from tests.reliability.test_multinode import tensors

TASK_SCRIPT = Path(__file__).with_name("scripts") / "slurm_task.py"
pytestmark = pytest.mark.timeout(400)


def trainer_cfg(**keys):
    return OmegaConf.create({"trainer": OmegaConf.structured(TrainerConfig(**keys))})


def slurm_env(procid: int = 0, ntasks: int = 2, nnodes: int = 1, nodelist: str | None = None, job: int = 4242,
              **extra: str) -> dict[str, str]:
    """What srun sets for task ``procid`` of ``ntasks`` spread block-wise over ``nnodes`` nodes (node01, ...)."""
    per_node = ntasks // nnodes
    nodelist = nodelist or (f"node[01-{nnodes:02d}]" if nnodes > 1 else "node01")
    env = {"SLURM_JOB_ID": str(job), "SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks),
           "SLURM_LOCALID": str(procid % per_node), "SLURM_NODEID": str(procid // per_node),
           "SLURM_NNODES": str(nnodes), "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_ID": "0"}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------- the hostlist
@pytest.mark.parametrize("nodelist, hosts", [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),  # zero padding, several ranges
    ("node-[1-2],login3", ["node-1", "node-2", "login3"]),  # several groups, one without brackets
    ("a[001-003]b", ["a001b", "a002b", "a003b"]),  # text after the brackets
    ("r[1-2]n[08-09]", ["r1n08", "r1n09", "r2n08", "r2n09"]),  # two bracketed lists in one group
    ("n[9-11]", ["n9", "n10", "n11"]),  # no padding: the numbers grow
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),  # padding of the lower bound
    ("cn5,gpu[2,4],x[1-1]", ["cn5", "gpu2", "gpu4", "x1"]),
    ("localhost", ["localhost"]),
])
def test_nodelist_forms_expand_like_scontrol_show_hostnames(nodelist, hosts):
    assert slurm.expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, says", [
    ("gpu[01-04", "unbalanced"), ("gpu01-04]", "unbalanced"), ("gpu[[1]]", "unbalanced"),
    ("gpu[a-b]", "'a-b' is not a number"), ("gpu[4-1]", "bad range"), ("gpu[]", "is not a number"),
    (",", "names no host"), ("n[1-99999999]", "bad range"),
])
def test_a_malformed_nodelist_is_one_line_naming_it(nodelist, says):
    with pytest.raises(UserError, match="SLURM_JOB_NODELIST") as caught:
        slurm.expand_nodelist(nodelist)
    assert says in str(caught.value)


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """A `scontrol` first on PATH: records each call's arguments in the returned file, prints FAKE_HOSTS for
    `show hostnames` and exits with FAKE_EXIT."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n'
                      'if [ "$1" = show ]; then printf "%s\\n" $FAKE_HOSTS; fi\nexit ${FAKE_EXIT:-0}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_scontrol_expands_the_nodelist_when_it_is_on_path(fake_scontrol, monkeypatch):
    monkeypatch.setenv("FAKE_HOSTS", "alpha beta")
    assert slurm.hostnames("whatever[1-2]") == ["alpha", "beta"]  # scontrol's answer, not the parser's
    assert fake_scontrol.read_text().split("\n")[0] == "show hostnames whatever[1-2]"


def test_the_parser_expands_when_scontrol_fails_or_is_absent(fake_scontrol, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "1")
    assert slurm.hostnames("gpu[07-08]") == ["gpu07", "gpu08"]
    assert fake_scontrol.read_text().count("show hostnames") == 1
    assert slurm.hostnames("gpu[07-08]", which=lambda name: None) == ["gpu07", "gpu08"]


def test_the_port_comes_from_the_job_id_within_the_documented_range_or_from_master_port():
    assert slurm.port_for_job(123) == 20123 and slurm.port_for_job(987_654) == 27654
    assert all(20000 <= slurm.port_for_job(j) <= 29999 for j in (0, 9999, 10000, 2**31))
    task = slurm.SlurmTask.from_env(slurm_env(job=5), which=lambda name: None)
    assert task.master == "node01:20005"
    task = slurm.SlurmTask.from_env(slurm_env(job=5, MASTER_PORT="31000"), which=lambda name: None)
    assert task.master == "node01:31000"


# --------------------------------------------------------------------------------------- the two conventions
def test_one_task_per_device_gives_the_task_the_environment_of_a_paddle_rank():
    env = slurm_env(procid=3, ntasks=4, nnodes=2, nodelist="gpu[01-02]", job=77)
    cluster = slurm.plan(trainer_cfg(device="cpu"), env, which=lambda name: None)
    assert cluster.mode == slurm.PER_DEVICE and not cluster.leader
    rank = cluster.rank_env()
    assert rank["PADDLE_TRAINER_ID"] == "3" and rank["PADDLE_TRAINERS_NUM"] == "4"
    assert rank["PADDLE_LOCAL_RANK"] == "1" and rank["PADDLE_LOCAL_SIZE"] == "2" and rank["PADDLE_NNODES"] == "2"
    # Ranks numbered node by node; rank 0's endpoint is the master, the first host, port from the job id.
    assert rank["PADDLE_TRAINER_ENDPOINTS"].split(",") == ["gpu01:20077", "gpu01:20078", "gpu02:20077",
                                                           "gpu02:20078"]
    assert rank["PADDLE_CURRENT_ENDPOINT"] == "gpu02:20078" and rank["PADDLE_MASTER"] == "gpu01:20077"
    assert rank["PADDLE_DISTRI_BACKEND"] == "gloo"  # CPU: gloo, as Paddle's launcher sets it
    assert cluster.node_spec == NodeSpec(1)  # it is a rank: no launcher of its own
    # trainer.devices may say the same as SLURM.
    assert slurm.plan(trainer_cfg(devices=2), env, which=lambda name: None).mode == slurm.PER_DEVICE


def test_one_task_per_node_runs_the_launcher_with_slurms_nodes_and_master():
    env = slurm_env(procid=1, ntasks=2, nnodes=2, nodelist="localhost,node-4", job=12)
    cluster = slurm.plan(trainer_cfg(devices=4), env, which=lambda name: None)
    assert cluster.mode == slurm.PER_NODE and not cluster.leader
    # The master by address: Paddle's launcher compares it with each node's own address.
    assert cluster.node_spec == NodeSpec(nproc=4, nnodes=2, node_rank=1, master="127.0.0.1:20012")
    assert slurm.plan(trainer_cfg(devices=4), slurm_env(0, 2, 2), which=lambda name: None).leader


def test_a_single_task_trains_as_one_process_and_leads():
    cluster = slurm.plan(trainer_cfg(), slurm_env(ntasks=1), which=lambda name: None)
    assert cluster.mode == slurm.PER_NODE and cluster.leader and cluster.node_spec == NodeSpec(1)
    cluster = slurm.plan(trainer_cfg(devices=2), slurm_env(ntasks=1), which=lambda name: None)
    assert cluster.node_spec == NodeSpec(2)  # one node's launcher, as `trainer.devices=2` without SLURM


def test_trainer_cluster_none_ignores_slurm_and_slurm_requires_it():
    assert slurm.plan(trainer_cfg(cluster="none"), slurm_env(), which=lambda name: None) is None
    assert slurm.plan(trainer_cfg(), {}, which=lambda name: None) is None  # auto, outside SLURM
    with pytest.raises(UserError, match="trainer.cluster=slurm but SLURM_JOB_ID"):
        slurm.plan(trainer_cfg(cluster="slurm"), {}, which=lambda name: None)


def test_trainer_cluster_is_schema_checked():
    with pytest.raises(ConfigError, match="trainer.cluster='pbs' is not allowed; choose one of: auto, slurm, none"):
        validate_config(compose_fit(["trainer.cluster=pbs"]))


@pytest.mark.parametrize("keys, env, says", [
    # Two tasks per node, but trainer.devices asks for three ranks on each.
    ({"devices": 3}, slurm_env(ntasks=4, nnodes=2), ["SLURM_NTASKS=4", "SLURM_NNODES=2", "trainer.devices=3"]),
    ({}, slurm_env(ntasks=3, nnodes=2), ["SLURM_NTASKS=3", "SLURM_NNODES=2", "evenly"]),
    ({"num_nodes": 4}, slurm_env(), ["trainer.num_nodes=4", "SLURM_NNODES=1"]),
    ({"master": "10.0.0.1:29500"}, slurm_env(), ["trainer.master", "SLURM_JOB_NODELIST", "trainer.cluster=none"]),
    ({}, {k: v for k, v in slurm_env().items() if k != "SLURM_STEP_ID"}, ["SLURM_NTASKS=2", "srun"]),
    ({}, slurm_env(ntasks=2, nnodes=2, nodelist="n1"), ["SLURM_JOB_NODELIST", "SLURM_NNODES=2"]),
    ({}, slurm_env(procid=1, ntasks=4, nnodes=2, SLURM_NODEID="1", SLURM_LOCALID="0"),
     ["SLURM_PROCID=1", "SLURM_NODEID=1", "--distribution=block"]),
    ({}, slurm_env(SLURM_NTASKS="two"), ["SLURM_NTASKS='two'"]),
    ({}, slurm_env(SLURM_NTASKS_PER_NODE="4"), ["SLURM_NTASKS_PER_NODE=4"]),
])
def test_combinations_that_cannot_work_are_one_line_naming_slurms_variables_and_the_keys(keys, env, says):
    with pytest.raises(UserError) as caught:
        slurm.plan(trainer_cfg(**keys), env, which=lambda name: None)
    for words in says:
        assert words in str(caught.value)


def test_the_leader_alone_holds_the_run_directory():
    env = slurm_env(procid=0, ntasks=2)
    assert slurm.holds_run_dir(trainer_cfg(), env)
    assert not slurm.holds_run_dir(trainer_cfg(), slurm_env(procid=1, ntasks=2))
    assert not slurm.holds_run_dir(trainer_cfg(devices=2), slurm_env(procid=1, ntasks=2, nnodes=2))
    assert slurm.holds_run_dir(trainer_cfg(), {}) and not slurm.holds_run_dir(trainer_cfg(num_nodes=2, node_rank=1), {})


# ------------------------------------------------------------------------------------------------ requeue
def test_only_the_leader_requeues_and_only_after_sigusr1(fake_scontrol, monkeypatch):
    leader = slurm.plan(trainer_cfg(), slurm_env(procid=0, job=991), which=lambda name: None)
    other = slurm.plan(trainer_cfg(), slurm_env(procid=1, job=991), which=lambda name: None)
    monkeypatch.setattr(slurm, "_active", other)
    assert slurm.requeue_after(ExitCode.INTERRUPTED_SIGUSR1) == ""
    monkeypatch.setattr(slurm, "_active", leader)
    assert slurm.requeue_after(ExitCode.INTERRUPTED_SIGTERM) == ""  # scancel, preemption: not ours to requeue
    assert not fake_scontrol.exists()
    assert "requeued SLURM job 991" in slurm.requeue_after(ExitCode.INTERRUPTED_SIGUSR1)
    assert fake_scontrol.read_text() == "requeue 991\n"
    monkeypatch.setenv("FAKE_EXIT", "1")
    assert "could not requeue SLURM job 991" in slurm.requeue_after(ExitCode.INTERRUPTED_SIGUSR1)
    monkeypatch.setenv("PATH", str(fake_scontrol.parent / "empty"))
    assert "scontrol is not on PATH" in slurm.requeue_after(ExitCode.INTERRUPTED_SIGUSR1)
    monkeypatch.setattr(slurm, "_active", None)  # not under SLURM
    assert slurm.requeue_after(ExitCode.INTERRUPTED_SIGUSR1) == ""


# ------------------------------------------------------------------------------------- real tasks on loopback
def free_job_id() -> int:
    """A job id whose port (20000 + id % 10000) is free on this machine now."""
    for job in np.random.default_rng().permutation(10000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", slurm.port_for_job(int(job))))
            except OSError:
                continue
        return int(job) + 10000 * 7  # ids beyond the port range wrap around, as real ones do
    raise AssertionError("no free port in 20000-29999")


def start_tasks(tmp_path: Path, command: list[str], ntasks: int, nnodes: int, job: int, name: str,
                extra_env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """``ntasks`` processes with the environment srun gives each, output in ``<name>.task<N>.out``."""
    procs = []
    for procid in range(ntasks):
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "HYDRA_FULL_ERROR": "0", **(extra_env or {}),
               **slurm_env(procid, ntasks, nnodes, ",".join(["localhost"] * nnodes), job)}
        with open(tmp_path / f"{name}.task{procid}.out", "w") as out:
            procs.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    return procs


def outputs(tmp_path: Path, name: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob(f"{name}.task*.out")))


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def test_two_tasks_form_one_group_from_slurms_variables_alone(tmp_path):
    """The shrunk form of the runs below: two srun tasks (one per device) become ranks 0 and 1 of one gloo group
    with no --master or --ips anywhere, and an all-reduce over them adds both ranks' values."""
    job = free_job_id()
    procs = start_tasks(tmp_path, [sys.executable, str(TASK_SCRIPT)], 2, 1, job, "group")
    codes = wait_all(procs, 180)
    text = outputs(tmp_path, "group")
    assert codes == [0, 0], text[-3000:]
    seen = sorted((json.loads(line) for line in text.splitlines() if line.startswith("{")), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["sum"]) for r in seen] == [(0, 2, 3), (1, 2, 3)], text[-3000:]
    assert {r["master"] for r in seen} == {f"localhost:{slurm.port_for_job(job)}"}


def test_sigusr1_saves_requeues_once_and_exits_138(tmp_path, fake_scontrol):
    """The shrunk form of the exact-resume test below: one task, SIGUSR1 mid-training to every process of the task
    (SLURM signals the whole job step: loader workers too, which must ignore it, as they do SIGTERM)."""
    run_dir = tmp_path / "run"
    job = free_job_id()
    procs = start_tasks(tmp_path, [sys.executable, "-m", "paddletrain.fit", *TINY, "data.num_workers=2",
                                   "trainer.max_epochs=500", f"hydra.run.dir={run_dir}"], 1, 1, job, "usr1")
    try:
        wait_for_checkpoint(run_dir, procs)
        os.killpg(procs[0].pid, signal.SIGUSR1)  # the task and its loader workers
    finally:
        codes = wait_all(procs, 120)
    text = outputs(tmp_path, "usr1")
    assert codes == [ExitCode.INTERRUPTED_SIGUSR1], text[-3000:]
    requeues = [line for line in fake_scontrol.read_text().splitlines() if line.startswith("requeue")]
    assert requeues == [f"requeue {job}"]  # (the other calls are `show hostnames localhost`)
    last = text.strip().splitlines()[-1]
    assert "Stopped by SIGUSR1" in last and "saved" in last and f"requeued SLURM job {job}" in last, last
    assert text.count("SIGUSR1 received") == 1 and "Traceback" not in text and "exit unexpectedly" not in text, text
    assert load_checkpoint(find_latest(run_dir / "checkpoints")).state["progress"]["global_step"] > 0


def wait_for_checkpoint(run_dir: Path, procs: list[subprocess.Popen], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "checkpoints").is_dir() and find_latest(run_dir / "checkpoints"):
            return
        assert all(p.poll() is None for p in procs), "a task ended before the first checkpoint"
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint within {timeout} s")


# ------------------------------------------------------------- whole runs, compared with trainer.devices=2 (slow)
SEED = ["trainer.seed=7", "trainer.max_epochs=3"]


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory) -> Path:
    """The run every SLURM run below must equal: `trainer.devices=2` on one machine, same seed and data."""
    tmp_path = tmp_path_factory.mktemp("devices2")
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [*TINY, *SEED, "trainer.devices=2", f"hydra.run.dir={run_dir}"],
                        cwd=tmp_path, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return run_dir


def assert_same_run(run_dir: Path, expected: Path) -> None:
    """Same metrics and steps, a checkpoint written by a group of 2, bitwise the same final weights and optimizer."""
    summary = json.loads((run_dir / "summary.json").read_text())
    reference = json.loads((expected / "summary.json").read_text())
    for key in ("train/loss", "val/loss", "val/top1", "global_step", "epochs"):
        assert summary[key] == reference[key], key
    ours, theirs = find_latest(run_dir / "checkpoints"), find_latest(expected / "checkpoints")
    assert ours.name == theirs.name
    assert load_checkpoint(ours).state["run"]["world_size"] == 2
    ours, theirs = tensors(ours), tensors(theirs)
    assert ours.keys() == theirs.keys() and len(ours) > 10
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def _fit_two_tasks(tmp_path, nodes: int) -> tuple[Path, str]:
    """A seeded TINY fit run as two SLURM tasks on ``nodes`` nodes; both must end with 0. (run dir, their output)"""
    run_dir = tmp_path / "run"
    procs = start_tasks(tmp_path, [sys.executable, "-m", "paddletrain.fit", *TINY, *SEED, f"hydra.run.dir={run_dir}"],
                        2, nodes, free_job_id(), "fit")
    codes = wait_all(procs, 300)
    text = outputs(tmp_path, "fit")
    assert codes == [0, 0], text[-3000:]
    return run_dir, text


@pytest.mark.slow
def test_one_task_per_device_trains_exactly_like_trainer_devices_2(tmp_path, two_devices):
    run_dir, text = _fit_two_tasks(tmp_path, nodes=1)
    assert "one task per device: task 0 of 2 is rank 0" in text
    assert "Launching" not in text  # each task is a rank: no launcher
    assert_same_run(run_dir, two_devices)
    run_log = (run_dir / "fit.log").read_text()
    assert "rank 1" not in run_log  # rank 0 alone writes the run's log (rank 1 not even its start-up line)


@pytest.mark.slow
def test_one_task_per_node_runs_the_launcher_on_each_node_exactly_like_trainer_devices_2(tmp_path, two_devices):
    run_dir, text = _fit_two_tasks(tmp_path, nodes=2)
    assert "one task per node: node 1 of 2 starts 1 rank(s)" in text
    assert "Launching 1 process(es) on node 1 of 2" in text
    assert (run_dir / "launch" / "node1" / "workerlog.0").is_file()
    assert_same_run(run_dir, two_devices)


@pytest.mark.slow
def test_sigusr1_requeues_once_and_resume_auto_continues_to_the_same_weights(tmp_path, two_devices, fake_scontrol):
    """Two tasks (one per device) get SIGUSR1 mid-run, as `#SBATCH --signal=USR1@90` sends it: both stop on the same
    step, rank 0 saves and requeues the job once; the requeued job (same id, same command with
    trainer.resume=auto) ends bitwise where an uninterrupted run ends."""
    run_dir = tmp_path / "run"
    job = free_job_id()
    command = [sys.executable, "-m", "paddletrain.fit", *TINY, *SEED, "trainer.resume=auto", f"hydra.run.dir={run_dir}"]
    procs = start_tasks(tmp_path, command, 2, 1, job, "first")
    try:
        wait_for_checkpoint(run_dir, procs)
        for proc in procs:  # SLURM signals every task of the step
            proc.send_signal(signal.SIGUSR1)
    finally:
        codes = wait_all(procs, 180)
    text = outputs(tmp_path, "first")
    assert codes == [ExitCode.INTERRUPTED_SIGUSR1] * 2, text[-3000:]
    assert [line for line in fake_scontrol.read_text().splitlines() if line.startswith("requeue")] == [
        f"requeue {job}"]
    stopped_at = load_checkpoint(find_latest(run_dir / "checkpoints")).state["progress"]["global_step"]
    assert 0 < stopped_at < 6, stopped_at  # 3 epochs of 2 steps: it stopped before the end

    procs = start_tasks(tmp_path, command, 2, 1, job, "requeued")
    codes = wait_all(procs, 300)
    text = outputs(tmp_path, "requeued")
    assert codes == [0, 0], text[-3000:]
    assert "Resumed from" in text
    assert_same_run(run_dir, two_devices)


@pytest.mark.slow
def test_sigusr1_with_one_task_per_node_requeues_once_from_node_0(tmp_path, fake_scontrol):
    """Each node's launcher passes SIGUSR1 to its ranks; they stop on the same step and rank 0 saves; node 0's
    launcher requeues (its ranks and node 1 do not)."""
    run_dir = tmp_path / "run"
    job = free_job_id()
    procs = start_tasks(tmp_path, [sys.executable, "-m", "paddletrain.fit", *TINY, "trainer.max_epochs=500",
                                   f"hydra.run.dir={run_dir}"], 2, 2, job, "nodes")
    try:
        wait_for_checkpoint(run_dir, procs)
        for proc in procs:
            proc.send_signal(signal.SIGUSR1)
    finally:
        codes = wait_all(procs, 180)
    text = outputs(tmp_path, "nodes")
    assert codes == [ExitCode.INTERRUPTED_SIGUSR1] * 2, text[-3000:]
    assert [line for line in fake_scontrol.read_text().splitlines() if line.startswith("requeue")] == [
        f"requeue {job}"]
    assert f"requeued SLURM job {job}" in (tmp_path / "nodes.task0.out").read_text().strip().splitlines()[-1]
