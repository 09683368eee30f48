"""Worker for tests/test_job_distributed.py: trains a BatchNorm-free model with the Trainer API and saves its
parameters. Run by `paddle.distributed.launch` (N processes) or directly (1 process on the global batch)."""
from __future__ import annotations

import sys

import numpy as np
import paddle

from paddletrain.config import DataConfig
from paddletrain.data import build_loader
from paddletrain.engine.limits import Limits
from paddletrain.engine.trainer import Trainer
from paddletrain.job import distributed


class Blobs(paddle.io.Dataset):
    """Fixed random images and labels (no augmentation, so batches are a pure function of the sampler)."""

    def __init__(self, n=64):
        rng = np.random.RandomState(0)
        self.x = rng.randn(n, 3, 8, 8).astype("float32")
        self.y = rng.randint(0, 4, n).astype("int64")
        self.classes = ["a", "b", "c", "d"]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def describe(self, i):
        return f"blobs[{i}]"


def main(out_prefix: str, batch_size: int, accumulate: int) -> None:
    distributed.init()
    rank, world = distributed.rank(), distributed.world_size()
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.ReLU(), paddle.nn.AdaptiveAvgPool2D(1),
                                 paddle.nn.Flatten(), paddle.nn.Linear(8, 4))
    model = distributed.wrap(model)
    optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=model.parameters())
    cfg = DataConfig(batch_size=batch_size, num_workers=0)
    loader = build_loader(Blobs(), cfg, train=True, seed=3, num_replicas=world, rank=rank)
    trainer = Trainer(model, optimizer, limits=Limits(max_epochs=2, accumulate_grad_batches=accumulate), rank=rank,
                      world_size=world, handle_signals=False)
    trainer.fit(loader)
    params = {p.name: p.numpy() for p in distributed.unwrap(model).parameters()}
    np.savez(f"{out_prefix}.rank{rank}.npz", steps=trainer.global_step,
             **{f"p{i}": v for i, v in enumerate(params.values())})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
