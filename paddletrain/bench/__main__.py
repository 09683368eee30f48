"""``python -m paddletrain.bench <benchmark> [key=value ...] [out=results.json]``.

Benchmarks: train, threads, overhead, data, decode, inference, precision, recipes, augment, index (keys: the fields
of each ``*BenchConfig``).
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

import dataclasses
import inspect
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paddletrain.cli import ending_of, run_script
from paddletrain.errors import ExitCode, UserError


def _benchmarks() -> dict[str, tuple[type, Callable[[Any], dict[str, Any]]]]:
    from paddletrain.bench.augment import AugmentBenchConfig, run_augment
    from paddletrain.bench.data import DataBenchConfig, run_data
    from paddletrain.bench.decode import DecodeBenchConfig, run_decode
    from paddletrain.bench.index import IndexBenchConfig, run_index
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
        "index": (IndexBenchConfig, run_index),
    }


# What each benchmark measures and one command that runs it (shown by --help).
ABOUT = {
    "train": ("training step images/s and ms/step", "python -m paddletrain.bench train model=resnet20 batch_size=64"),
    "threads": ("the training step at each CPU thread count", "python -m paddletrain.bench threads threads=[1,2]"),
    "overhead": ("the Trainer's per-step overhead over a bare loop",
                 "python -m paddletrain.bench overhead model=tiny batch_size=8 image_size=8 steps=50"),
    "data": ("decode+augment rate, loader rate per worker count, data-wait share",
             "python -m paddletrain.bench data workers=[0,1,2] epochs=3"),
    "decode": ("predict's decode pipeline (workers, shared memory) in images/s",
               "python -m paddletrain.bench decode images=256 image_size=224"),
    "inference": ("dygraph vs exported predictor by batch size, and the predict pipeline",
                  "python -m paddletrain.bench inference model=resnet18 batch_sizes=[1,8,32] out=bench/inference.json"),
    "precision": ("fp32 vs bf16 predictor logit error and top-1 agreement, and the mistakes the export check catches",
                  "python -m paddletrain.bench precision model=resnet50 images=<folder of photos>"),
    "recipes": ("plain vs regularised vs distilled val top-1, mean ± std over seeds, via the fit command line",
                "python -m paddletrain.bench recipes datasets=[fashion_mnist] seeds=[0,1,2] out=bench/recipes.json"),
    "augment": ("the Trainer's data-wait share of the default job with every augmentation on",
                "python -m paddletrain.bench augment num_workers=2 image_size=32"),
    "index": ("a million files: list parse time, index vs list memory, worker memory per epoch, scan cache",
              "python -m paddletrain.bench index lines=1281167 folder_files=100000"),
}
HELP_FLAGS = ("-h", "--help", "help")


def _field_comments(schema: type) -> dict[str, str]:
    """The ``#`` comment lines right above each field of ``schema`` (and its bases): the key's meaning."""
    comments: dict[str, str] = {}
    for cls in reversed(schema.__mro__[:-1]):
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        pending: list[str] = []
        for line in lines:
            text = line.strip()
            if text.startswith("#"):
                pending.append(text.lstrip("# "))
                continue
            match = re.match(r"(\w+)\s*:", text)
            inline = text.split("  # ", 1)[1] if match and "  # " in text else ""
            if match and (pending or inline):
                comments[match.group(1)] = " ".join([*pending, inline]).strip()
            pending = []
    return comments


def usage(name: str | None = None) -> str:
    """The --help text: every benchmark with an example, or one benchmark's keys, defaults and example."""
    benchmarks = _benchmarks()
    if name is None:
        rows = [f"  {bench:<10} {ABOUT[bench][0]}\n  {'':<10} e.g. {ABOUT[bench][1]}" for bench in benchmarks]
        return ("usage: python -m paddletrain.bench <benchmark> [key=value ...] [out=results.json]\n\n"
                "Prints markdown tables; out= also writes the JSON and a .md beside it.\n\nBenchmarks:\n"
                + "\n".join(rows) + "\n\nKeys of one benchmark: python -m paddletrain.bench <benchmark> --help")
    schema = benchmarks[name][0]
    comments = _field_comments(schema)
    defaults = dataclasses.asdict(schema())
    keys = [f"  {f.name}={defaults[f.name]}" + (f"    # {comments[f.name]}" if f.name in comments else "")
            for f in dataclasses.fields(schema)]
    return (f"usage: python -m paddletrain.bench {name} [key=value ...] [out=results.json]\n\n"
            f"Measures {ABOUT[name][0]}.\n\nExample:\n  {ABOUT[name][1]}\n\nKeys (defaults shown):\n"
            + "\n".join(keys) + "\n  out=None    # also write the results as JSON (and .md) there")


def run(argv: list[str]) -> dict[str, Any]:
    """Parse ``<benchmark> key=value ...``, run it, print markdown and write ``out=`` if given."""
    from paddletrain.bench.common import parse_options
    from paddletrain.bench.report import to_markdown, write_report

    benchmarks = _benchmarks()
    if not argv or argv[0] not in benchmarks:
        got = f" (got {argv[0]!r})" if argv else ""
        raise UserError(f"usage: python -m paddletrain.bench <{'|'.join(benchmarks)}> [key=value ...] "
                        f"[out=results.json]{got}")
    name, args = argv[0], argv[1:]
    out: str | None = None
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
    argv = sys.argv[1:]
    if not argv or argv[0] in HELP_FLAGS or (len(argv) > 1 and argv[0] in ABOUT and argv[1] in HELP_FLAGS):
        print(usage(argv[0] if argv and argv[0] in ABOUT else None))
        sys.exit(ExitCode.OK if argv else ExitCode.USER_ERROR)
    try:
        run(sys.argv[1:])
    except UserError as exc:
        code, line = ending_of(exc)  # the codes every command ends with
        print(f"error: {line}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    run_script(main)
