"""Train with the Python API alone: no Hydra, every object built by hand and handed to the Trainer.

    python examples/python_api.py              # resnet20 on the embedded shapes dataset
    python examples/python_api.py --epochs 1 --train-images 256 --out /tmp/api-run
"""
from __future__ import annotations

import argparse
from pathlib import Path

import paddle

from paddletrain import Limits, Precision, Trainer, create_model
from paddletrain.callbacks import EarlyStopping, ModelCheckpoint, ProgressBar
from paddletrain.config import DataConfig, OptimConfig, SchedConfig
from paddletrain.data import ShapesDataset, build_loader, build_transform
from paddletrain.optim import build_optimizer
from paddletrain.schedules import build_scheduler, optimizer_steps_per_epoch, schedule_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("outputs/python_api"))
    args = parser.parse_args()

    paddle.seed(0)
    data_cfg = DataConfig(batch_size=128, std=[0.25, 0.25, 0.25])
    train_set = ShapesDataset("train", num_samples=args.train_images)
    val_set = ShapesDataset("val", num_samples=max(args.train_images // 4, 64))
    train_loader = build_loader(train_set, data_cfg, train=True, seed=0, transform=build_transform(data_cfg, True))
    val_loader = build_loader(val_set, data_cfg, train=False, seed=0, transform=build_transform(data_cfg, False))

    model = create_model("resnet20", num_classes=len(train_set.classes))
    sched_cfg = SchedConfig(name="cosine", warmup_epochs=0.5)
    steps = schedule_steps(optimizer_steps_per_epoch(len(train_loader), 1), args.epochs, sched_cfg.warmup_epochs)
    scheduler = build_scheduler(sched_cfg, 0.1, steps)
    optimizer = build_optimizer(model, OptimConfig(name="sgd", lr=0.1), scheduler)
    trainer = Trainer(
        model, optimizer, scheduler=scheduler, precision=Precision(),  # Precision(enabled=True) for AMP on GPUs
        callbacks=[ProgressBar(), EarlyStopping(patience=3), ModelCheckpoint()],  # checkpoints in <run_dir>
        limits=Limits(max_epochs=args.epochs), num_classes=len(train_set.classes), run_dir=str(args.out),
    )
    metrics = trainer.fit(train_loader, val_loader)
    print(f"val/top1={metrics['val/top1']:.4f} val/loss={metrics['val/loss']:.4f}")


if __name__ == "__main__":
    main()
