"""``python -m comparisons <benchmark> [key=value ...] [out=results.json]`` from a checkout.

Benchmarks: overhead, decode, recipes, full_scale, ablation, step_profile, mkl_dispatch, conv_input_grad,
time_split, search, shards.

Examples::

    python -m comparisons overhead model=tiny batch_size=8 image_size=8 steps=50
    python -m comparisons overhead experiment=fashion_mnist_949 arms=[trainer,hand] windows=40 steps=10
    python -m comparisons decode images=256 image_size=224
    python -m comparisons recipes datasets=[fashion_mnist] seeds=[0,1,2] out=bench/recipes.json
    python -m comparisons full_scale runs=[outputs/fashion_mnist_949/seed0] picture=curves.png
    python -m comparisons ablation root=ablation/fashion_mnist_fast
    python -m comparisons step_profile model=resnet20 width=2 batch_size=64 image_size=28 in_chans=1
    python -m comparisons mkl_dispatch rounds=3
    python -m comparisons conv_input_grad model=resnet20 width=2 batch_size=64 image_size=28
    python -m comparisons time_split run=outputs/fashion_mnist_949/seed1 profile=bench/step_profile.json
    python -m comparisons search out_dir=sweeps/compare_pruning
    python -m comparisons shards num_images=2048 image_size=224
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paddletrain.bench.command import Suite, run_suite
from paddletrain.cli import run_script


def benchmarks() -> dict[str, tuple[type, Callable[[Any], dict[str, Any]]]]:
    from comparisons.ablation import AblationConfig, run_ablation
    from comparisons.conv_input_grad import ConvInputGradConfig, run_conv_input_grad
    from comparisons.decode import DecodeBenchConfig, run_decode
    from comparisons.full_scale import FullScaleConfig, run_full_scale
    from comparisons.mkl_dispatch import MklDispatchConfig, run_mkl_dispatch
    from comparisons.overhead import OverheadBenchConfig, run_overhead
    from comparisons.recipes import RecipesBenchConfig, run_recipes
    from comparisons.search import SearchCompareConfig, run_search
    from comparisons.shards import ShardsCompareConfig, run_shards
    from comparisons.step_profile import StepProfileConfig, run_step_profile
    from comparisons.time_split import TimeSplitConfig, run_time_split

    return {
        "overhead": (OverheadBenchConfig, run_overhead),
        "decode": (DecodeBenchConfig, run_decode),
        "recipes": (RecipesBenchConfig, run_recipes),
        "full_scale": (FullScaleConfig, run_full_scale),
        "ablation": (AblationConfig, run_ablation),
        "step_profile": (StepProfileConfig, run_step_profile),
        "mkl_dispatch": (MklDispatchConfig, run_mkl_dispatch),
        "conv_input_grad": (ConvInputGradConfig, run_conv_input_grad),
        "time_split": (TimeSplitConfig, run_time_split),
        "search": (SearchCompareConfig, run_search),
        "shards": (ShardsCompareConfig, run_shards),
    }


# What each benchmark measures and one command that runs it (shown by --help).
ABOUT = {
    "overhead": ("the Trainer's per-step overhead over a bare loop",
                 "python -m comparisons overhead model=tiny batch_size=8 image_size=8 steps=50"),
    "decode": ("predict's decode pipeline (workers, shared memory) in images/s",
               "python -m comparisons decode images=256 image_size=224"),
    "recipes": ("plain vs regularised vs distilled val top-1, mean ± std over seeds, via the fit command line",
                "python -m comparisons recipes datasets=[fashion_mnist] seeds=[0,1,2] out=bench/recipes.json"),
    "full_scale": ("finished full-scale runs: val and test top-1, minutes, images/s, time-to-accuracy, a picture",
                   "python -m comparisons full_scale runs=[outputs/fashion_mnist_949/seed0] picture=curves.png"),
    "ablation": ("a recipe's validation top-1 with each piece removed in turn (a sweep per variant, evaluate's "
                 "records of each run), mean ± sd over seeds and the difference from the full recipe",
                 "python -m comparisons ablation root=ablation/fashion_mnist_fast"),
    "step_profile": ("a training step's forward/backward/optimizer split and GFLOP/s against the measured peak",
                     "python -m comparisons step_profile model=resnet20 width=2 batch_size=64 image_size=28 "
                     "in_chans=1"),
    "mkl_dispatch": ("MKL's own code path on this CPU against the one paddletrain sets (training images/s, matmul)",
                     "python -m comparisons mkl_dispatch rounds=3"),
    "conv_input_grad": ("a stride-1 convolution's input gradient: Paddle's CPU kernel against a forward "
                        "convolution, per layer and over the training step",
                        "python -m comparisons conv_input_grad model=resnet20 width=2 batch_size=64 image_size=28"),
    "time_split": ("where a finished run's wall time went: forward, backward, optimizer (by a step profile's "
                   "shares), data wait, hooks, validation, checkpoints",
                   "python -m comparisons time_split run=docs/results/fashion_mnist_949/seed0 "
                   "profile=docs/results/fashion_mnist_949/step_profile.json"),
    "search": ("a study with its pruner against the same study without, and the config's own values: training "
               "steps and best values", "python -m comparisons search out_dir=sweeps/compare_pruning"),
    "shards": ("tar shards (local, over loopback HTTP cold and cached) against the image folder they were packed "
               "from: loader images/s, pack images/s, worker memory over an epoch",
               "python -m comparisons shards num_images=2048 image_size=224"),
}

SUITE = Suite("python -m comparisons", benchmarks, ABOUT)



def main() -> None:
    """``python -m comparisons``: see the module docstring."""
    run_suite(SUITE)


if __name__ == "__main__":
    run_script(main)
