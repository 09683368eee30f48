"""``python -m paddletrain.data check|split|pack``: the dataset tools' command line (thin: parse, call, print).

The work is done by :func:`paddletrain.data.tools.check.check_dataset`,
:func:`paddletrain.data.tools.split.split_folder` and
:func:`paddletrain.data.shards.pack.pack`;
this module only turns arguments into their calls, their results into text (or JSON) and the outcome into an
:class:`~paddletrain.errors.ExitCode`: 0 clean (warnings allowed), 3 a check found errors, 2 a usage mistake (a
missing path, a bad option) in one line without a traceback.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from paddletrain.cli import run_script
from paddletrain.console import install_warning_filters
from paddletrain.errors import ExitCode, UserError

if TYPE_CHECKING:
    from paddletrain.data.tools.check import CheckReport

EXAMPLES = """\
examples:
  python -m paddletrain.data check data/hymenoptera_data     # a root with train/ and val/: leaks between them too
  python -m paddletrain.data check photos/ --min-size 64     # one folder of <class>/<image> folders
  python -m paddletrain.data check train_list.txt val_list.txt --root data/ --class-names labels.txt
  python -m paddletrain.data check data/ --json > report.json    # for machines: one JSON document
  python -m paddletrain.data split photos/ --val 0.1 --seed 0    # photos/{train,val}_list.txt, class_names.txt
  python -m paddletrain.fit data=labellist data.root=photos data.train_list=train_list.txt \\
      data.val_list=val_list.txt data.class_names=class_names.txt
  python -m paddletrain.data pack data/hymenoptera_data --out shards/ --shard-size 64   # train-*.tar, val-*.tar
  python -m paddletrain.data pack train_list.txt --root data/ --out shards/ --class-names labels.txt
  python -m paddletrain.fit data=shards "data.urls='shards/train-{000000..000003}.tar'" \\
      data.val_urls=shards/val-000000.tar

exit status: 0 clean (warnings allowed), 3 errors found, 2 a usage mistake (missing path, bad option)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage mistake ends as every command's user error does (argparse's own prints its usage first)."""
        raise UserError(f"{message} (see python -m paddletrain.data {self._sub()}--help)")

    def _sub(self) -> str:
        name = self.prog.rsplit(" ", 1)[-1]
        return f"{name} " if name in ("check", "split", "pack") else ""


def _parser() -> argparse.ArgumentParser:
    from paddletrain.data.tools.check import DEFAULT_MIN_SIZE, DEFAULT_TIMEOUT

    parser = _Parser(prog="python -m paddletrain.data", description="Check, split or pack an image dataset.",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{check,split,pack}",
                                     parser_class=_Parser)
    check = commands.add_parser(
        "check", help="read everything the loader would and report every problem",
        description="Read everything training would read, without training: one line per problem (file, list line, "
                    "kind), then the class histogram, the imbalance ratio and balanced class weights.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("inputs", nargs="+", metavar="folder or list",
                       help="an image folder root (<root>/{train,val}/<class>/<image>), split folders "
                            "(<folder>/<class>/<image>), or label list files (the first is training)")
    check.add_argument("--root", help="the folder list paths are relative to (data.root; default: the list's folder)")
    check.add_argument("--delimiter", default=" ", help="between path and label in a list (data.delimiter)")
    check.add_argument("--multilabel", action="store_true", help="lists of <path><TAB><0/1,...> (data.multilabel)")
    check.add_argument("--class-names", help="a file naming the classes of the lists, one a line (data.class_names)")
    check.add_argument("--min-size", type=int, default=DEFAULT_MIN_SIZE,
                       help=f"report images with a side below this many pixels (default {DEFAULT_MIN_SIZE})")
    check.add_argument("--workers", type=int, help="decode processes (default: the usable cores; 0: none)")
    check.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                       help=f"seconds one image may take to decode (default {DEFAULT_TIMEOUT:g})")
    check.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    check.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    split = commands.add_parser(
        "split", help="write stratified train/val label lists of a folder of class folders",
        description="Write train_list.txt, val_list.txt and class_names.txt (PaddleClas format, paths relative to "
                    "the folder) with a stratified, seeded split; no image is copied.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    split.add_argument("folder", help="<folder>/<class>/<image>")
    split.add_argument("--val", default="0.1", help="the share of each class for val (default 0.1)")
    split.add_argument("--seed", type=int, default=0, help="the seed of the split (default 0)")
    split.add_argument("--out", help="where the lists go (default: the folder)")
    split.add_argument("--force", action="store_true", help="overwrite existing lists")
    pack = commands.add_parser(
        "pack", help="write the images into WebDataset-layout tar shards with an index",
        description="Write tar shards (<key>.<ext> as the file was, <key>.cls or <key>.json its label) and "
                    "<prefix>.index.json (class names, each shard's sha256 and its samples' offsets), seeded and "
                    "stratified so that every shard holds every class; for data=shards.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("input", metavar="folder or list",
                      help="a folder of <class>/<image> folders, a root with train/ and val/ (both packed), or a "
                           "label list")
    pack.add_argument("--out", required=True, help="the folder the shards and the index go to")
    pack.add_argument("--shard-size", type=float, default=256.0, metavar="MB",
                      help="a shard closes before it passes this many megabytes (default 256)")
    pack.add_argument("--seed", type=int, default=0, help="the seed of the stratified order (default 0)")
    pack.add_argument("--prefix", help="shard names <prefix>-NNNNNN.tar (default: the folder's or list's name; "
                                       "train and val for a root with both)")
    pack.add_argument("--root", help="the folder list paths are relative to (default: the list's folder)")
    pack.add_argument("--class-names", help="a file naming the list's classes, one a line")
    pack.add_argument("--multilabel", action="store_true", help="a list of <path><TAB><0/1,...> lines")
    pack.add_argument("--delimiter", default=" ", help="between path and label in a list")
    pack.add_argument("--force", action="store_true", help="overwrite existing shards of the same prefix")
    return parser


def _column_names(report: CheckReport) -> list[str]:
    """Each split by its last path component (``train``, ``val_list.txt``), unless two would share a name."""
    short = [os.path.basename(s.name.rstrip("/" + os.sep)) or s.name for s in report.splits]
    return short if len(set(short)) == len(short) else [s.name for s in report.splits]


def _table(report: CheckReport) -> list[str]:
    """The class histogram of every split, with the first split's weights."""
    names = _column_names(report)
    widths = [max(6, len(n)) for n in names]
    width = max([5, *map(len, report.classes)])
    lines = [f"{'class':<{width}}  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))
             + "  weight"]
    for c, name in enumerate(report.classes):
        counts = "  ".join(f"{s.counts[c]:>{w}}" for s, w in zip(report.splits, widths, strict=True))
        weight = report.weights[c]
        lines.append(f"{name:<{width}}  {counts}  {'-' if weight is None else f'{weight:.3f}':>6}")
    return lines


def _print_check(report: CheckReport) -> None:
    for problem in report.problems:
        print(problem)
    if report.problems:
        print()
    print("\n".join(_table(report)))
    if report.splits:
        ratio = report.imbalance
        print(f"imbalance ratio (largest / smallest class of {_column_names(report)[0]}): "
              + ("-" if ratio is None else f"{ratio:.2f}"))
    by_kind = ", ".join(f"{kind}: {n}" for kind, n in report.counts_by_kind().items())
    errors, warnings = len(report.errors), len(report.warnings)
    print(f"{sum(s.images for s in report.splits)} images; {errors} error{'s' * (errors != 1)}, {warnings} "
          f"warning{'s' * (warnings != 1)}" + (f" ({by_kind})" if by_kind else ""))


def _check(args: argparse.Namespace) -> int:
    from paddletrain.data.tools.check import check_dataset

    report = check_dataset(args.inputs, root=args.root, delimiter=args.delimiter, multilabel=args.multilabel,
                           class_names=args.class_names, min_size=args.min_size, workers=args.workers,
                           timeout=args.timeout or None, progress=not args.no_progress and not args.json)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, ensure_ascii=False))
    else:
        _print_check(report)
    return report.exit_code


def _split(args: argparse.Namespace) -> int:
    from paddletrain.data.tools.split import split_folder

    result = split_folder(args.folder, val=args.val, seed=args.seed, out=args.out, force=args.force)
    total_val = sum(result.val_counts)
    print(f"wrote {', '.join(map(str, result.files))}: {sum(result.train_counts)} train and {total_val} val images "
          f"of {len(result.classes)} classes")
    return ExitCode.OK


def _pack(args: argparse.Namespace) -> int:
    from paddletrain.data.shards.pack import pack

    result = pack(args.input, args.out, shard_size_mb=args.shard_size, seed=args.seed, prefix=args.prefix,
                  root=args.root, class_names=args.class_names, multilabel=args.multilabel,
                  delimiter=args.delimiter, force=args.force)
    for split in result.splits:
        print(f"wrote {len(split.shards)} shards of {split.samples} images ({split.images_per_second:.0f} images/s) "
              f"and {split.index_path}")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``check``, ``split`` or ``pack`` with ``argv`` (default: the command line); returns the exit status."""
    install_warning_filters()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)
    args = _parser().parse_args(argv)
    if getattr(args, "min_size", 0) < 0 or (getattr(args, "workers", None) or 0) < 0:
        raise UserError("--min-size and --workers must not be negative")
    # A UserError (DatasetError is one) ends the command as every command's does (paddletrain.cli.run_script).
    return {"check": _check, "split": _split, "pack": _pack}[args.command](args)


if __name__ == "__main__":
    run_script(main)
