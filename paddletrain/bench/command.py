"""What every benchmark command shares: ``<program> <benchmark> [key=value ...] [out=results.json]``.

A :class:`Suite` names a program, its benchmarks (each a config dataclass and a function of it) and one line
about each with an example; :func:`run_suite` parses, runs, prints the markdown tables and writes ``out=``. The
package's own suite is ``python -m paddletrain.bench`` (what a user measures on their own hardware); the
maintainers' comparisons are ``python -m comparisons`` in a checkout (outside the wheel).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddletrain.errors import ExitCode, UserError

HELP_FLAGS = ("-h", "--help", "help")


@dataclass(frozen=True)
class Suite:
    """A benchmark command: its program, ``load() -> {name: (config dataclass, run function)}`` (imported when
    asked, so --help stays fast) and ``about[name] = (what it measures, an example command)``."""

    program: str
    load: Callable[[], dict[str, tuple[type, Callable[[Any], dict[str, Any]]]]]
    about: dict[str, tuple[str, str]]


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


def usage(suite: Suite, name: str | None = None) -> str:
    """The --help text: every benchmark with an example, or one benchmark's keys, defaults and example."""
    benchmarks, about, program = suite.load(), suite.about, suite.program
    if name is None:
        rows = [f"  {bench:<10} {about[bench][0]}\n  {'':<10} e.g. {about[bench][1]}" for bench in benchmarks]
        return (f"usage: {program} <benchmark> [key=value ...] [out=results.json]\n\n"
                "Prints markdown tables; out= also writes the JSON and a .md beside it.\n\nBenchmarks:\n"
                + "\n".join(rows) + f"\n\nKeys of one benchmark: {program} <benchmark> --help")
    schema = benchmarks[name][0]
    comments = _field_comments(schema)
    defaults = dataclasses.asdict(schema())
    keys = [f"  {f.name}={defaults[f.name]}" + (f"    # {comments[f.name]}" if f.name in comments else "")
            for f in dataclasses.fields(schema)]
    return (f"usage: {program} {name} [key=value ...] [out=results.json]\n\n"
            f"Measures {about[name][0]}.\n\nExample:\n  {about[name][1]}\n\nKeys (defaults shown):\n"
            + "\n".join(keys) + "\n  out=None    # also write the results as JSON (and .md) there")


def run(suite: Suite, argv: list[str]) -> dict[str, Any]:
    """Parse ``<benchmark> key=value ...``, run it, print markdown and write ``out=`` if given."""
    from paddletrain.bench.common import parse_options
    from paddletrain.bench.report import to_markdown, write_report

    benchmarks = suite.load()
    if not argv or argv[0] not in benchmarks:
        got = f" (got {argv[0]!r})" if argv else ""
        raise UserError(f"usage: {suite.program} <{'|'.join(benchmarks)}> [key=value ...] "
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


def run_suite(suite: Suite) -> None:
    """``<program> <benchmark> [key=value ...]``: the benchmark's tables, or --help."""
    # Per-epoch progress lines from the timed Trainer runs would bury the tables.
    logging.getLogger("paddletrain").setLevel(logging.WARNING)
    argv = sys.argv[1:]
    if not argv or argv[0] in HELP_FLAGS or (len(argv) > 1 and argv[0] in suite.about and argv[1] in HELP_FLAGS):
        print(usage(suite, argv[0] if argv and argv[0] in suite.about else None))
        sys.exit(ExitCode.OK if argv else ExitCode.USER_ERROR)
    # A UserError ends the command as every command's does (paddletrain.cli.run_script).
    run(suite, sys.argv[1:])
