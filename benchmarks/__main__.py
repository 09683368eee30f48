"""``python -m benchmarks <overhead|recipes|decode> [key=value ...] [out=results.json]`` from a checkout.

Examples::

    python -m benchmarks overhead model=tiny batch_size=8 image_size=8 steps=50
    python -m benchmarks decode images=256 image_size=224
    python -m benchmarks recipes datasets=[fashion_mnist] seeds=[0,1,2] out=bench/recipes.json
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paddletrain.bench.command import Suite, run_suite
from paddletrain.cli import run_script


def benchmarks() -> dict[str, tuple[type, Callable[[Any], dict[str, Any]]]]:
    from benchmarks.decode import DecodeBenchConfig, run_decode
    from benchmarks.overhead import OverheadBenchConfig, run_overhead
    from benchmarks.recipes import RecipesBenchConfig, run_recipes

    return {
        "overhead": (OverheadBenchConfig, run_overhead),
        "decode": (DecodeBenchConfig, run_decode),
        "recipes": (RecipesBenchConfig, run_recipes),
    }


# What each benchmark measures and one command that runs it (shown by --help).
ABOUT = {
    "overhead": ("the Trainer's per-step overhead over a bare loop",
                 "python -m benchmarks overhead model=tiny batch_size=8 image_size=8 steps=50"),
    "decode": ("predict's decode pipeline (workers, shared memory) in images/s",
               "python -m benchmarks decode images=256 image_size=224"),
    "recipes": ("plain vs regularised vs distilled val top-1, mean ± std over seeds, via the fit command line",
                "python -m benchmarks recipes datasets=[fashion_mnist] seeds=[0,1,2] out=bench/recipes.json"),
}

SUITE = Suite("python -m benchmarks", benchmarks, ABOUT)



def main() -> None:
    """``python -m benchmarks``: see the module docstring."""
    run_suite(SUITE)


if __name__ == "__main__":
    run_script(main)
