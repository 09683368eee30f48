"""CPU threads chosen per run: this process's share of the usable cores, less what its data side needs."""
from __future__ import annotations

import logging

import paddle
import pytest

from paddletrain.job import runtime
from paddletrain.job.runtime import default_cpu_threads, ranks_on_this_node, set_cpu_threads, setup_runtime


@pytest.mark.parametrize("cores, workers, ranks, threads, reason", [
    (2, 0, 1, 1, "2 usable cores, less 1 left for the rest of the machine"),  # 2 threads measured slower here
    (2, 1, 1, 1, "2 usable cores, less 1 data worker"),  # the default job (data.num_workers=1)
    (16, 0, 1, 15, "16 usable cores, less 1 left for the rest of the machine"),
    (16, 4, 1, 12, "16 usable cores, less 4 data workers"),
    (8, 2, 2, 2, "8 usable cores, 4 per rank of the 2 on this node, less 2 data workers"),
    (8, 0, 2, 3, "8 usable cores, 4 per rank of the 2 on this node, less 1 left for the rest of the machine"),
    (2, 4, 1, 1, "2 usable cores, less 4 data workers"),  # never below one thread
    (3, 0, 4, 1, "3 usable cores, 1 per rank of the 4 on this node, less 1 left for the rest of the machine"),
    (1, 0, 1, 1, "1 usable core, less 1 left for the rest of the machine"),
])
def test_default_threads_are_this_process_share_of_the_cores(cores, workers, ranks, threads, reason):
    assert default_cpu_threads(workers, ranks, cores=cores) == (threads, reason)


def test_ranks_on_this_node_come_from_the_launcher(monkeypatch):
    monkeypatch.delenv("PADDLE_LOCAL_SIZE", raising=False)
    assert ranks_on_this_node() == 1
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "4")
    assert ranks_on_this_node() == 4
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "four")
    assert ranks_on_this_node() == 1


def test_setup_runtime_sets_and_logs_the_count_and_why(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "usable_cores", lambda: 8)
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "2")
    chosen = []
    monkeypatch.setattr(paddle.base.core, "set_num_threads", chosen.append)
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        info = setup_runtime("cpu", None, data_workers=1)
    assert info.cpu_threads == 3 and chosen == [3]
    assert info.cpu_threads_reason == "8 usable cores, 4 per rank of the 2 on this node, less 1 data worker"
    assert f"3 CPU threads ({info.cpu_threads_reason})" in caplog.records[-1].getMessage()
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        assert setup_runtime("cpu", 5, data_workers=1).cpu_threads == 5
    assert chosen[-1] == 5 and "5 CPU threads (set explicitly)" in caplog.records[-1].getMessage()


def test_set_cpu_threads_refuses_zero(monkeypatch):
    monkeypatch.setattr(paddle.base.core, "set_num_threads", lambda n: None)
    with pytest.raises(ValueError, match="cpu_threads must be >= 1"):
        set_cpu_threads(0)
    assert set_cpu_threads(None, data_workers=0, ranks=1) == default_cpu_threads(0, 1)[0]
