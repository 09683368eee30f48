"""MKL's code path on AMD CPUs: chosen from /proc/cpuinfo's vendor and flags, never over the user's own value."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paddletrain.devices import MKL_CPU_TYPE_ENV, cpu_flags, mkl_cpu_type, set_mkl_cpu_type

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


def test_importing_paddletrain_sets_it_for_this_machine_before_paddle_is_imported():
    env = {k: v for k, v in os.environ.items() if k != MKL_CPU_TYPE_ENV}
    code = ("import os, sys; import paddletrain; print(os.environ.get('MKL_DEBUG_CPU_TYPE')); "
            "print('paddle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    value, paddle_imported = out.stdout.split()
    expected = mkl_cpu_type(*cpu_flags())
    assert value == str(expected) and paddle_imported == "False"
