"""comparisons/mkl_dispatch.py: MKL's own path and paddletrain's, each in processes of its own."""
from __future__ import annotations

import pytest

from comparisons.mkl_dispatch import MklDispatchConfig, run_mkl_dispatch


@pytest.mark.slow  # two processes timing matrix products (10 s)
def test_mkl_dispatch_runs_both_paths_in_processes_of_their_own(tmp_path):
    result = run_mkl_dispatch(MklDispatchConfig(image_size=8, batch_size=4, steps=2, rounds=1))
    own, ours = result["rows"]
    assert own["MKL path"] == "MKL's own path" and ours["MKL path"].startswith("paddletrain's (MKL_DEBUG_CPU_TYPE=")
    assert own["training images/s (median)"] > 0 and ours["2048 matmul GFLOP/s (median)"] > 0
    assert result["ratio"] == pytest.approx(ours["training images/s (median)"] / own["training images/s (median)"])
