"""``python -m paddletrain.bench <benchmark> [key=value ...] [out=results.json]``: what a user measures on their
own hardware.

Benchmarks: train, threads, data, inference, precision, augment, index (keys: the fields of each
``*BenchConfig``). The maintainers' comparisons (the Trainer's overhead over a hand loop, the recipes, the decode
pool against paddle.io.DataLoader) are ``python -m comparisons`` in a checkout, outside the wheel.
Prints the markdown tables; ``out=`` also writes the JSON and a ``.md`` beside it.

Examples::

    python -m paddletrain.bench train model=resnet20 batch_size=64 cpu_threads=1
    python -m paddletrain.bench inference model=resnet18 batch_sizes=[1,8,32,64] out=bench/inference.json
    python -m paddletrain.bench precision model=resnet50 images=<folder of photos>
    python -m paddletrain.bench augment num_workers=2 image_size=32
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paddletrain.bench.command import Suite, run_suite
from paddletrain.cli import run_script


def benchmarks() -> dict[str, tuple[type, Callable[[Any], dict[str, Any]]]]:
    from paddletrain.bench.augment import AugmentBenchConfig, run_augment
    from paddletrain.bench.data import DataBenchConfig, run_data
    from paddletrain.bench.inference import InferenceBenchConfig, run_inference
    from paddletrain.bench.million_files import IndexBenchConfig, run_index
    from paddletrain.bench.precision_cost import PrecisionBenchConfig, run_precision
    from paddletrain.bench.train import ThreadsBenchConfig, TrainBenchConfig, run_threads, run_train

    return {
        "train": (TrainBenchConfig, run_train),
        "threads": (ThreadsBenchConfig, run_threads),
        "data": (DataBenchConfig, run_data),
        "inference": (InferenceBenchConfig, run_inference),
        "precision": (PrecisionBenchConfig, run_precision),
        "augment": (AugmentBenchConfig, run_augment),
        "index": (IndexBenchConfig, run_index),
    }


# What each benchmark measures and one command that runs it (shown by --help).
ABOUT = {
    "train": ("training step images/s and ms/step", "python -m paddletrain.bench train model=resnet20 batch_size=64"),
    "threads": ("the training step at each CPU thread count", "python -m paddletrain.bench threads threads=[1,2]"),
    "data": ("decode+augment rate, loader rate per worker count, data-wait share",
             "python -m paddletrain.bench data workers=[0,1,2] epochs=3"),
    "inference": ("dygraph vs exported predictor by batch size, and the predict pipeline",
                  "python -m paddletrain.bench inference model=resnet18 batch_sizes=[1,8,32] out=bench/inference.json"),
    "precision": ("fp32 vs bf16 predictor logit error and top-1 agreement, and the mistakes the export check catches",
                  "python -m paddletrain.bench precision model=resnet50 images=<folder of photos>"),
    "augment": ("the Trainer's data-wait share of the default job with every augmentation on",
                "python -m paddletrain.bench augment num_workers=2 image_size=32"),
    "index": ("a million files: list parse time, index vs list memory, worker memory per epoch, scan cache",
              "python -m paddletrain.bench index lines=1281167 folder_files=100000"),
}


SUITE = Suite("python -m paddletrain.bench", benchmarks, ABOUT)


def main() -> None:
    """``python -m paddletrain.bench``: see the module docstring."""
    run_suite(SUITE)


if __name__ == "__main__":
    run_script(main)
