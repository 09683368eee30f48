"""``python -m paddletrain.bench <benchmark> [key=value ...] [out=results.json]``.

Benchmarks: train, threads, overhead, data, decode, inference, precision, recipes, augment (keys: the fields of each ``*BenchConfig``).
Prints the markdown tables; ``out=`` also writes the JSON and a ``.md`` beside it.

Examples::

    python -m paddletrain.bench train model=resnet20 batch_size=64 cpu_threads=1
    python -m paddletrain.bench overhead model=tiny batch_size=8 image_size=8 steps=50
    python -m paddletrain.bench decode images=256 image_size=224
    python -m paddletrain.bench inference model=resnet18 batch_sizes=[1,8,32,64] out=bench/inference.json
    python -m paddletrain.bench precision model=resnet50 images=<folder of photos>
    python -m paddletrain.bench augment num_workers=2 image_size=32
    python -m paddletrain.bench recipes datasets=[fashion_mnist] seeds=[0,1,2] out=bench/recipes.json
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from paddletrain.errors import ExitCode, UserError


def _benchmarks() -> Dict[str, Tuple[type, Callable[[Any], Dict[str, Any]]]]:
    from paddletrain.bench.augment import AugmentBenchConfig, run_augment
    from paddletrain.bench.data import DataBenchConfig, run_data
    from paddletrain.bench.decode import DecodeBenchConfig, run_decode
    from paddletrain.bench.inference import InferenceBenchConfig, run_inference
    from paddletrain.bench.overhead import OverheadBenchConfig, run_overhead
    from paddletrain.bench.precision import PrecisionBenchConfig, run_precision
    from paddletrain.bench.recipes import RecipesBenchConfig, run_recipes
    from paddletrain.bench.train import ThreadsBenchConfig, TrainBenchConfig, run_threads, run_train

    return {
        "train": (TrainBenchConfig, run_train),
        "threads": (ThreadsBenchConfig, run_threads),
        "overhead": (OverheadBenchConfig, run_overhead),
        "data": (DataBenchConfig, run_data),
        "decode": (DecodeBenchConfig, run_decode),
        "inference": (InferenceBenchConfig, run_inference),
        "precision": (PrecisionBenchConfig, run_precision),
        "recipes": (RecipesBenchConfig, run_recipes),
        "augment": (AugmentBenchConfig, run_augment),
    }


def run(argv: List[str]) -> Dict[str, Any]:
    """Parse ``<benchmark> key=value ...``, run it, print markdown and write ``out=`` if given."""
    from paddletrain.bench.common import parse_options
    from paddletrain.bench.report import to_markdown, write_report

    benchmarks = _benchmarks()
    if not argv or argv[0] not in benchmarks:
        got = f" (got {argv[0]!r})" if argv else ""
        raise UserError(f"usage: python -m paddletrain.bench <{'|'.join(benchmarks)}> [key=value ...] "
                        f"[out=results.json]{got}")
    name, args = argv[0], argv[1:]
    out: Optional[str] = None
    for arg in [a for a in args if a.startswith("out=")]:
        out = arg.split("=", 1)[1]
        args.remove(arg)
    schema, bench = benchmarks[name]
    result = bench(parse_options(schema, args, name))
    print(to_markdown(result))
    if out:
        markdown = write_report(result, Path(out))
        print(f"wrote {out} and {markdown}")
    return result


def main() -> None:
    # Per-epoch progress lines from the timed Trainer runs would bury the tables.
    logging.getLogger("paddletrain").setLevel(logging.WARNING)
    try:
        run(sys.argv[1:])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(ExitCode.USER_ERROR)


if __name__ == "__main__":
    main()
