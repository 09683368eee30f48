"""The devices paddletrain runs on: the device names every CLI and API accepts, and the CPU math path on AMD CPUs.

``DEVICES`` (``trainer.device``, ``export``/``predict`` ``device=``) lives in a leaf module, so that the light
inference module and the config schema can share the one list without importing each other or Paddle.

**MKL on AMD CPUs.** Paddle's CPU kernels for convolutions and matrix products call ``libmklml_intel``, an MKL
that chooses its code path by CPU vendor: on an AMD CPU it takes a generic path whatever the CPU supports. Its
``MKL_DEBUG_CPU_TYPE`` variable names the path instead (5: AVX2, 7: AVX-512). On a 2-core AMD EPYC with AVX-512,
``python -m comparisons mkl_dispatch``: Fashion-MNIST recipe training 44.1 -> 133 images/s, ``paddle.matmul``
46.5 -> 237 GFLOP/s (docs/performance.md#cpu-math-on-amd-cpus). MKL reads the variable when it first dispatches,
so :func:`use_fast_mkl` sets it before any kernel runs: every ``python -m paddletrain.<command>`` calls it first
thing (ranks and data workers inherit it), and logs once what it set; ``import paddletrain`` leaves the
environment alone, so a program of your own calls it itself. A value the user set is kept, and
``PADDLETRAIN_MKL=leave`` keeps MKL's own choice; on Intel CPUs and CPUs without AVX2 nothing is set.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEVICES", "MKL_CPU_TYPE_ENV", "MKL_SWITCH_ENV", "cpu_flags", "mkl_cpu_type", "mkl_note",
           "set_mkl_cpu_type", "use_fast_mkl"]

# auto: a GPU when this Paddle build has CUDA and sees one, else the CPU.
DEVICES = ("auto", "cpu", "gpu")

MKL_CPU_TYPE_ENV = "MKL_DEBUG_CPU_TYPE"
# PADDLETRAIN_MKL=leave: the commands leave MKL_DEBUG_CPU_TYPE as it is (unset: MKL's own choice).
MKL_SWITCH_ENV = "PADDLETRAIN_MKL"
_PATHS = {"5": "AVX2", "7": "AVX-512"}
# What use_fast_mkl set in this process, for the command's log once it is set up (None: nothing).
_set_here: str | None = None
# MKL's names for its code paths, and the CPU flags each needs (AVX-512 as on Skylake-SP and later, not Xeon Phi).
_AVX512 = ("7", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}))
_AVX2 = ("5", frozenset({"avx2", "fma"}))


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """The first CPU's vendor id and flags as Linux reports them; ``("", {})`` where there is no such file."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return "", frozenset()
    vendor, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if vendor and flags:
            break
    return vendor, flags


def mkl_cpu_type(vendor: str, flags: frozenset[str]) -> str | None:
    """The MKL code path for an AMD CPU with ``flags``; None for other vendors or CPUs without AVX2 and FMA."""
    if vendor != "AuthenticAMD":
        return None
    for value, needs in (_AVX512, _AVX2):
        if needs <= flags:
            return value
    return None


def set_mkl_cpu_type(environ: dict[str, str] | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """Set ``MKL_DEBUG_CPU_TYPE`` for this CPU unless it is set already; returns the value in force (or None)."""
    environ = os.environ if environ is None else environ
    if MKL_CPU_TYPE_ENV in environ:
        return environ[MKL_CPU_TYPE_ENV]
    value = mkl_cpu_type(*cpu_flags(cpuinfo))
    if value is not None:
        environ[MKL_CPU_TYPE_ENV] = value
    return value


def use_fast_mkl(environ: dict[str, str] | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """Give MKL its AVX-512 or AVX2 path on an AMD CPU (:func:`set_mkl_cpu_type`) unless ``PADDLETRAIN_MKL=leave``
    or the variable is set already; returns what it set (None: nothing). Call it before Paddle's first kernel."""
    global _set_here
    environ = os.environ if environ is None else environ
    if environ.get(MKL_SWITCH_ENV, "").lower() == "leave" or MKL_CPU_TYPE_ENV in environ:
        return None
    value = set_mkl_cpu_type(environ, cpuinfo)
    if value is not None:
        _set_here = value
    return value


def mkl_note() -> str | None:
    """One line saying what :func:`use_fast_mkl` set in this process, once (None: nothing, or said already)."""
    global _set_here
    value, _set_here = _set_here, None
    if value is None:
        return None
    return (f"MKL takes its {_PATHS.get(value, value)} path on this AMD CPU ({MKL_CPU_TYPE_ENV}={value}, set by "
            f"paddletrain: 2.4-3x the training speed of MKL's own choice there; {MKL_SWITCH_ENV}=leave keeps "
            "MKL's choice)")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
