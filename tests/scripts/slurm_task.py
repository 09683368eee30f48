"""One SLURM task for tests/test_job_slurm.py: joins the job from SLURM's variables alone (one task per device, as
``paddletrain.fit`` does), all-reduces ``rank + 1`` and prints what it saw as one JSON line."""
from __future__ import annotations

import json

import paddle
from omegaconf import OmegaConf

from paddletrain.config import TrainerConfig
from paddletrain.job import distributed, slurm


def main() -> None:
    cfg = OmegaConf.create({"trainer": OmegaConf.structured(TrainerConfig(cluster="slurm", device="cpu"))})
    cluster = slurm.plan(cfg)
    slurm.activate(cluster)
    distributed.init()
    value = paddle.to_tensor([distributed.rank() + 1], dtype="int64")
    paddle.distributed.all_reduce(value)
    print(json.dumps({"rank": distributed.rank(), "world": distributed.world_size(), "sum": int(value.item()),
                      "mode": cluster.mode, "master": cluster.task.master}), flush=True)


if __name__ == "__main__":
    main()
