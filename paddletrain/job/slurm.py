"""Start under SLURM's ``srun`` with no hand-written ``--master``/``--ips``, and requeue before the time limit.

SLURM starts the tasks; this module reads what it tells each of them (``SLURM_*`` variables) and turns it into
what paddletrain already knows how to run, in one of two conventions (docs/distributed.md, "SLURM"):

- **one task per device** (``srun --ntasks-per-node=D``, Lightning's convention): each task *is* a rank. It gets
  the environment ``paddle.distributed.launch`` would have given it (:meth:`ClusterPlan.rank_env`) and trains in
  place; paddletrain starts no launcher.
- **one task per node** (``srun --ntasks-per-node=1``): each task runs paddletrain's launcher for its node's
  ``trainer.devices`` ranks, with the node count, its node rank and the master taken from SLURM
  (:attr:`ClusterPlan.node_spec`).

The master is the first host of ``SLURM_JOB_NODELIST`` (expanded by ``scontrol show hostnames`` when it is on
``PATH``, else by :func:`expand_nodelist`), its port ``MASTER_PORT`` or :func:`port_for_job`.

Requeue (``#SBATCH --signal=USR1@90``): SIGUSR1 stops the run like SIGTERM (every rank stops after the same step,
rank 0 saves); then the job's leader alone (global rank 0, or node 0's launcher) runs
``scontrol requeue $SLURM_JOB_ID`` (:func:`requeue_after`) and exits with
:attr:`~paddletrain.errors.ExitCode.INTERRUPTED_SIGUSR1`. SLURM starts the same script again with the same job
id, and ``trainer.resume=auto`` continues exactly where it stopped.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import paddle

from paddletrain.config import CLUSTERS
from paddletrain.errors import ExitCode, UserError
from paddletrain.job.launcher import NodeSpec

log = logging.getLogger("paddletrain")

PER_DEVICE = "one task per device"
PER_NODE = "one task per node"
# The master's port when MASTER_PORT is not set: PORT_BASE + job id modulo PORT_SPAN, i.e. 20000-29999. Two jobs
# whose first node is the same machine collide only when their ids are equal modulo 10000.
PORT_BASE = 20000
PORT_SPAN = 10000
REQUEUE_SIGNAL = signal.SIGUSR1
SCONTROL_TIMEOUT = 30.0
# The largest hostlist paddletrain expands itself (a typo such as `n[1-99999999]` must not exhaust memory).
MAX_HOSTS = 100_000

# One bracketed range list of a hostlist: "01-04,07".
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_nodelist(nodelist: str) -> list[str]:
    """The host names of a compressed SLURM hostlist, in order: ``gpu[01-02,07]`` -> gpu01, gpu02, gpu07.

    Groups are separated by commas outside brackets (``node-[1-2],login3``); a group may hold several bracketed
    lists, expanded left to right (``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2) and text after them
    (``a[001-003]b``). A range keeps the zero padding of its lower bound, as SLURM writes it.
    """
    hosts: list[str] = []
    for group in _split_groups(nodelist):
        expanded = [""]
        position = 0
        for match in _BRACKETS.finditer(group):
            literal = group[position:match.start()]
            names = _expand_ranges(match.group(1), nodelist)
            expanded = [f"{head}{literal}{name}" for head in expanded for name in names]
            if len(expanded) > MAX_HOSTS:
                raise UserError(f"SLURM_JOB_NODELIST={nodelist!r} names more than {MAX_HOSTS} hosts")
            position = match.end()
        tail = group[position:]
        if any(c in tail for c in "[]") or any(c in h for h in expanded for c in "[]"):
            raise UserError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced brackets in {group!r}")
        hosts += [f"{head}{tail}" for head in expanded]
    if not hosts:
        raise UserError(f"SLURM_JOB_NODELIST={nodelist!r} names no host")
    return hosts


def _split_groups(nodelist: str) -> list[str]:
    """The comma-separated groups of a hostlist; commas inside brackets belong to the ranges."""
    groups, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise UserError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced brackets")
        if char == "," and depth == 0:
            groups.append(nodelist[start:i])
            start = i + 1
    if depth:
        raise UserError(f"SLURM_JOB_NODELIST={nodelist!r}: unbalanced brackets")
    groups.append(nodelist[start:])
    return [g.strip() for g in groups if g.strip()]


def _expand_ranges(ranges: str, nodelist: str) -> list[str]:
    """``01-03,07`` -> 01, 02, 03, 07 (the width of each range's lower bound is kept)."""
    names = []
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise UserError(f"SLURM_JOB_NODELIST={nodelist!r}: {part!r} is not a number or a range like 01-04")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low) or int(high) - int(low) >= MAX_HOSTS:
            raise UserError(f"SLURM_JOB_NODELIST={nodelist!r}: bad range {part!r}")
        names += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return names


def hostnames(nodelist: str, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The hosts of ``nodelist``: SLURM's own ``scontrol show hostnames`` when it is on ``PATH`` (it knows every
    form the installed version accepts), else :func:`expand_nodelist`."""
    scontrol = which("scontrol")
    if scontrol is not None:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                                  timeout=SCONTROL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("scontrol show hostnames failed (%s); expanding %s here", exc, nodelist)
        else:
            hosts = done.stdout.split()
            if done.returncode == 0 and hosts:
                return hosts
            log.debug("scontrol show hostnames exited %d (%s); expanding %s here", done.returncode,
                      done.stderr.strip(), nodelist)
    return expand_nodelist(nodelist)


def port_for_job(job_id: int) -> int:
    """The master's port for SLURM job ``job_id``: the same on every task of the job, and differing between jobs
    (:data:`PORT_BASE` + ``job_id`` modulo :data:`PORT_SPAN`)."""
    return PORT_BASE + job_id % PORT_SPAN


@dataclass(frozen=True)
class SlurmTask:
    """What SLURM tells one task of ``srun`` about itself and its job."""

    job_id: int
    procid: int  # SLURM_PROCID: the task's number in the job step
    ntasks: int  # SLURM_NTASKS
    localid: int  # SLURM_LOCALID: the task's number on its node
    nodeid: int  # SLURM_NODEID: its node's number
    nnodes: int  # SLURM_NNODES
    hosts: tuple[str, ...]  # SLURM_JOB_NODELIST, expanded
    port: int  # MASTER_PORT, or port_for_job(job_id)
    in_step: bool  # started by srun (SLURM_STEP_ID is set), not the batch script itself
    tasks_per_node: int | None = None  # SLURM_NTASKS_PER_NODE, when srun was given --ntasks-per-node

    @classmethod
    def from_env(cls, env: Mapping[str, str], which: Callable[[str], str | None] = shutil.which) -> SlurmTask:
        """Read the task from ``env``; a missing or malformed variable is a :class:`UserError` naming it."""
        job_id = _int_var(env, "SLURM_JOB_ID", minimum=0)
        port = _int_var(env, "MASTER_PORT", minimum=1) if env.get("MASTER_PORT") else port_for_job(job_id)
        if port > 65535:
            raise UserError(f"MASTER_PORT={port} is not a port (1-65535)")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise UserError("SLURM_JOB_NODELIST is not set: cannot tell which host is the master")
        per_node = env.get("SLURM_NTASKS_PER_NODE")
        return cls(job_id=job_id, procid=_int_var(env, "SLURM_PROCID"), ntasks=_int_var(env, "SLURM_NTASKS", 1),
                   localid=_int_var(env, "SLURM_LOCALID"), nodeid=_int_var(env, "SLURM_NODEID"),
                   nnodes=_int_var(env, "SLURM_NNODES", 1), hosts=tuple(hostnames(nodelist, which)), port=port,
                   in_step="SLURM_STEP_ID" in env or "SLURM_STEPID" in env,
                   tasks_per_node=_int_var(env, "SLURM_NTASKS_PER_NODE", 1) if per_node else None)

    @property
    def master(self) -> str:
        return f"{self.hosts[0]}:{self.port}"


def _int_var(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    value = env.get(name)
    if value is None:
        raise UserError(f"{name} is not set: this process does not look like a task started by srun "
                        "(set trainer.cluster=none to ignore SLURM)")
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise UserError(f"{name}={value!r} is not an integer >= {minimum}")
    return number


@dataclass
class ClusterPlan:
    """How this SLURM task takes part in the job: as one rank (:data:`PER_DEVICE`) or as its node's launcher
    (:data:`PER_NODE`, with :attr:`node_spec`)."""

    mode: str
    task: SlurmTask
    devices_per_node: int
    backend_env: dict[str, str] = field(default_factory=dict)

    @property
    def leader(self) -> bool:
        """Whether this task speaks for the job: holds the run directory and requeues it (task 0, on node 0)."""
        return self.task.procid == 0 if self.mode == PER_DEVICE else self.task.nodeid == 0

    @property
    def node_spec(self) -> NodeSpec:
        """This node's share of the job for paddletrain's launcher (one process alone when it is one rank)."""
        if self.mode == PER_DEVICE:
            return NodeSpec(1)
        if self.task.nnodes == 1:
            return NodeSpec(self.devices_per_node)  # this node's launcher alone: nobody to meet
        # By address: Paddle's launcher starts its rendezvous server only on the node whose own address (or
        # 127.0.0.1) is the master's, so a host name would leave every node waiting for "master not ready".
        host = self.task.hosts[0]
        try:
            address = socket.gethostbyname(host)
        except OSError as exc:
            raise UserError(f"cannot resolve {host}, the first host of SLURM_JOB_NODELIST (the master): {exc}") from exc
        return NodeSpec(self.devices_per_node, self.task.nnodes, self.task.nodeid, f"{address}:{self.task.port}")

    def rank_env(self) -> dict[str, str]:
        """What ``paddle.distributed.launch`` gives a rank, for this task as global rank ``SLURM_PROCID``.

        ``init_parallel_env`` needs the rank, the world size, this rank's endpoint and the master (its TCP store,
        through which gloo on CPUs and NCCL on GPUs exchange their addresses); the rest is what paddletrain and
        Paddle read about the job's shape. Ranks are numbered node by node (SLURM's default block distribution).
        """
        task, per_node = self.task, self.devices_per_node
        endpoints = [f"{task.hosts[r // per_node]}:{task.port + r % per_node}" for r in range(task.ntasks)]
        return {
            "PADDLE_TRAINER_ID": str(task.procid), "PADDLE_TRAINERS_NUM": str(task.ntasks),
            "PADDLE_GLOBAL_RANK": str(task.procid), "PADDLE_GLOBAL_SIZE": str(task.ntasks),
            "PADDLE_LOCAL_RANK": str(task.localid), "PADDLE_RANK_IN_NODE": str(task.localid),
            "PADDLE_LOCAL_SIZE": str(per_node), "PADDLE_NNODES": str(task.nnodes),
            "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[task.procid],
            "PADDLE_MASTER": task.master, **self.backend_env,
        }

    def describe(self) -> str:
        task = self.task
        if self.mode == PER_DEVICE:
            return (f"SLURM job {task.job_id}, {PER_DEVICE}: task {task.procid} of {task.ntasks} is rank "
                    f"{task.procid} (local rank {task.localid} on node {task.nodeid}); master {task.master}")
        return (f"SLURM job {task.job_id}, {PER_NODE}: node {task.nodeid} of {task.nnodes} starts "
                f"{self.devices_per_node} rank(s); master {task.master}")


def plan(cfg: Any, env: Mapping[str, str] | None = None,
         which: Callable[[str], str | None] = shutil.which) -> ClusterPlan | None:
    """How this process joins a SLURM job, or None when ``trainer.cluster`` (auto: SLURM's variables present)
    says it does not run under SLURM. An inconsistent combination is a :class:`UserError` naming SLURM's
    variables and the keys."""
    env = os.environ if env is None else env
    t = cfg.trainer
    cluster = t.get("cluster", "auto")
    if cluster not in CLUSTERS:
        raise UserError(f"trainer.cluster={cluster} must be one of {', '.join(CLUSTERS)}")
    if cluster == "none":
        return None
    if "SLURM_JOB_ID" not in env or "SLURM_PROCID" not in env:
        if cluster == "slurm":
            raise UserError("trainer.cluster=slurm but SLURM_JOB_ID/SLURM_PROCID are not set: start the command "
                            "with srun inside a SLURM job, or set trainer.cluster=auto")
        return None
    task = SlurmTask.from_env(env, which)
    _check_keys_left_to_slurm(t, task)
    per_node = _tasks_per_node(task)
    if per_node == 1:
        return ClusterPlan(PER_NODE, task, t.devices)
    if t.devices not in (1, per_node):
        raise UserError(
            f"SLURM runs {per_node} tasks per node (SLURM_NTASKS={task.ntasks}, SLURM_NNODES={task.nnodes}) but "
            f"trainer.devices={t.devices}: with one task per device each task is one rank, so set "
            f"trainer.devices={per_node} (or leave it at 1); with one task per node (srun --ntasks-per-node=1) "
            "paddletrain starts trainer.devices ranks on each node")
    if task.procid != task.nodeid * per_node + task.localid:
        raise UserError(
            f"SLURM_PROCID={task.procid} is not SLURM_NODEID={task.nodeid} x {per_node} + SLURM_LOCALID="
            f"{task.localid}: paddletrain numbers ranks node by node; use srun's default --distribution=block")
    return ClusterPlan(PER_DEVICE, task, per_node, _backend_env(t.get("device", "auto"), task.localid))


def _check_keys_left_to_slurm(t: Any, task: SlurmTask) -> None:
    """SLURM decides the nodes and the master: the same keys set by hand must agree or stay unset."""
    if t.num_nodes not in (1, task.nnodes):
        raise UserError(f"trainer.num_nodes={t.num_nodes} but SLURM_NNODES={task.nnodes}: under SLURM leave "
                        "trainer.num_nodes unset (or set trainer.cluster=none to configure the nodes by hand)")
    if t.node_rank != 0 or t.master:
        raise UserError(f"trainer.node_rank={t.node_rank}, trainer.master={t.master}: under SLURM the node rank and "
                        f"the master come from SLURM_NODEID and SLURM_JOB_NODELIST; leave them unset (or set "
                        "trainer.cluster=none)")
    if task.ntasks > 1 and not task.in_step:
        raise UserError(f"SLURM_NTASKS={task.ntasks} but this process was not started by srun (SLURM_STEP_ID is "
                        "not set): run `srun python -m paddletrain.fit ...` in the batch script, or set "
                        "trainer.cluster=none to ignore SLURM")
    if len(task.hosts) != task.nnodes:
        raise UserError(f"SLURM_JOB_NODELIST names {len(task.hosts)} host(s) ({','.join(task.hosts[:4])}...) but "
                        f"SLURM_NNODES={task.nnodes}")
    if not (task.procid < task.ntasks and task.nodeid < task.nnodes):
        raise UserError(f"SLURM_PROCID={task.procid} (of SLURM_NTASKS={task.ntasks}) or SLURM_NODEID="
                        f"{task.nodeid} (of SLURM_NNODES={task.nnodes}) is out of range")


def _tasks_per_node(task: SlurmTask) -> int:
    if task.ntasks % task.nnodes:
        raise UserError(f"SLURM_NTASKS={task.ntasks} tasks do not divide evenly over SLURM_NNODES={task.nnodes} "
                        "nodes: give srun --ntasks-per-node")
    per_node = task.ntasks // task.nnodes
    if task.tasks_per_node not in (None, per_node):
        raise UserError(f"SLURM_NTASKS_PER_NODE={task.tasks_per_node} but SLURM_NTASKS={task.ntasks} over "
                        f"SLURM_NNODES={task.nnodes} nodes is {per_node} per node")
    return per_node


def _backend_env(device: str, localid: int) -> dict[str, str]:
    """Gloo on CPUs; on GPUs NCCL with this task's card (what Paddle's launcher sets for each)."""
    has_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    if device == "cpu" or not has_gpu:
        return {"PADDLE_DISTRI_BACKEND": "gloo"}
    return {"FLAGS_selected_gpus": str(localid)}


# The plan this process acts on (set by :func:`activate`): it decides whether this process requeues the job.
_active: ClusterPlan | None = None


def activate(cluster: ClusterPlan) -> None:
    """Act on ``cluster``: remember it (for :func:`requeue_after`) and, with one task per device, make this process
    its rank (Paddle's variables)."""
    global _active
    _active = cluster
    if cluster.mode == PER_DEVICE:
        os.environ.update(cluster.rank_env())


def holds_run_dir(cfg: Any, env: Mapping[str, str] | None = None) -> bool:
    """Whether this process locks the job's (shared) run directory: node 0's under SLURM (task 0 with one task
    per device), else the process with ``trainer.node_rank=0``."""
    cluster = plan(cfg, env)
    return cluster.leader if cluster is not None else not cfg.trainer.get("node_rank", 0)


def requeue_after(code: int, run: Callable[..., Any] = subprocess.run) -> str:
    """Requeue the SLURM job when this process leads it and the run stopped on :data:`REQUEUE_SIGNAL`; the words
    to add to the run's last line (empty when there is nothing to say)."""
    if code != ExitCode.INTERRUPTED_SIGUSR1 or _active is None or not _active.leader:
        return ""
    job = str(_active.task.job_id)
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"; could not requeue SLURM job {job}: scontrol is not on PATH (resubmit the job to continue)"
    try:
        done = run([scontrol, "requeue", job], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"; could not requeue SLURM job {job}: {exc} (resubmit the job to continue)"
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return f"; could not requeue SLURM job {job}: scontrol requeue said {reason[0]} (resubmit the job to continue)"
    return f"; requeued SLURM job {job} (it continues with trainer.resume=auto when it starts again)"
