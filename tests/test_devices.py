"""MKL's code path on AMD CPUs: chosen from /proc/cpuinfo's vendor and flags, never over the user's own value."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paddletrain.devices import (
    MKL_CPU_TYPE_ENV,
    MKL_SWITCH_ENV,
    cpu_flags,
    mkl_cpu_type,
    mkl_note,
    set_mkl_cpu_type,
    use_fast_mkl,
)

ZEN4 = "avx avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16"


def cpuinfo(tmp_path, vendor: str, flags: str):
    path = tmp_path / "cpuinfo"
    cpu = f"processor\t: {{n}}\nvendor_id\t: {vendor}\nmodel name\t: X\nflags\t\t: {flags}\n\n"
    path.write_text(cpu.format(n=0) + cpu.format(n=1))
    return path


@pytest.mark.parametrize("vendor, flags, expected", [
    ("AuthenticAMD", ZEN4, "7"),  # AVX-512 as on Skylake-SP: MKL's AVX-512 path
    ("AuthenticAMD", "sse4_2 avx avx2 fma", "5"),  # AVX2 only (EPYC Rome/Milan): MKL's AVX2 path
    ("AuthenticAMD", "sse4_2 avx avx2", None),  # no FMA: leave MKL's own choice
    ("AuthenticAMD", "avx avx2 fma avx512f avx512cd", "5"),  # a partial AVX-512 is not MKL's AVX-512 path
    ("GenuineIntel", ZEN4, None),  # MKL chooses well on Intel CPUs
])
def test_the_path_follows_vendor_and_flags(tmp_path, vendor, flags, expected):
    assert mkl_cpu_type(*cpu_flags(cpuinfo(tmp_path, vendor, flags))) == expected
    environ: dict[str, str] = {}
    assert set_mkl_cpu_type(environ, cpuinfo(tmp_path, vendor, flags)) == expected
    assert environ == ({MKL_CPU_TYPE_ENV: expected} if expected else {})


def test_a_value_the_user_set_is_kept(tmp_path):
    environ = {MKL_CPU_TYPE_ENV: "4"}
    assert set_mkl_cpu_type(environ, cpuinfo(tmp_path, "AuthenticAMD", ZEN4)) == "4"
    assert environ == {MKL_CPU_TYPE_ENV: "4"}


def test_no_cpuinfo_sets_nothing(tmp_path):
    environ: dict[str, str] = {}
    assert set_mkl_cpu_type(environ, tmp_path / "missing") is None and environ == {}


def test_importing_paddletrain_leaves_the_environment_alone():
    env = {k: v for k, v in os.environ.items() if k != MKL_CPU_TYPE_ENV}
    code = "import os, sys; import paddletrain; print(os.environ.get('MKL_DEBUG_CPU_TYPE'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert out.stdout.split() == ["None"]


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, "7"),
    ({MKL_SWITCH_ENV: "leave"}, None),  # the switch: MKL's own choice
    ({MKL_SWITCH_ENV: "LEAVE"}, None),
    ({MKL_CPU_TYPE_ENV: "5"}, None),  # the user's own value is kept
])
def test_use_fast_mkl_sets_the_path_unless_told_to_leave_it_and_says_so_once(tmp_path, environ, expected):
    before = dict(environ)
    assert use_fast_mkl(environ, cpuinfo(tmp_path, "AuthenticAMD", ZEN4)) == expected
    note = mkl_note()
    if expected is None:
        assert environ == before and note is None
    else:
        assert environ == {**before, MKL_CPU_TYPE_ENV: expected}
        assert note.startswith("MKL takes its AVX-512 path on this AMD CPU (MKL_DEBUG_CPU_TYPE=7, set by paddletrain")
        assert "PADDLETRAIN_MKL=leave" in note
        assert mkl_note() is None  # once


def test_a_command_sets_it_for_this_machine_and_logs_it_once(tmp_path):
    """The data check, as a user runs it: MKL's path is in force in its process when this CPU is an AMD one."""
    env = {k: v for k, v in os.environ.items() if k not in (MKL_CPU_TYPE_ENV, MKL_SWITCH_ENV)}
    code = ("import os; from paddletrain.cli import run_script; "
            "run_script(lambda: print('in force:', os.environ.get('MKL_DEBUG_CPU_TYPE')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    expected = mkl_cpu_type(*cpu_flags())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["in", "force:", str(expected)]
    assert (out.stderr.count("MKL takes its") == 1) == (expected is not None)


@pytest.mark.slow  # two processes a path, timing resnet20's training step (about a minute)
@pytest.mark.skipif(mkl_cpu_type(*cpu_flags()) is None,
                    reason=f"needs an AMD CPU with AVX2 (MKL_DEBUG_CPU_TYPE changes MKL's path only there); this "
                           f"one is {cpu_flags()[0] or 'unknown'}")
def test_the_path_paddletrain_sets_still_speeds_training_up():
    """Says when a Paddle update makes the setting pointless: MKL's own choice then trains as fast."""
    import paddle

    from comparisons.mkl_dispatch import MklDispatchConfig, run_mkl_dispatch

    result = run_mkl_dispatch(MklDispatchConfig(width=1, batch_size=32, steps=10, repeats=1, rounds=2))
    assert result["ratio"] >= 1.5, (
        f"MKL_DEBUG_CPU_TYPE={mkl_cpu_type(*cpu_flags())} gives {result['ratio']:.2f}x MKL's own path with paddle "
        f"{paddle.__version__}: MKL now chooses well by itself on this CPU, so paddletrain.devices.use_fast_mkl "
        "and its documentation (docs/performance.md#cpu-math-on-amd-cpus) can go")
