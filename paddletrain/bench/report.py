"""Render benchmark results as markdown tables and write them next to their JSON."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``rows``: columns in first-seen order, list values (per-window raw data) left out."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k, v in row.items() if k not in columns and not isinstance(v, (list, dict))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_value(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(result: dict[str, Any]) -> str:
    """The result's tables, summary, goals and notes, headed by where and under which load it ran."""
    env = result["environment"]
    parts = [f"### bench {result['benchmark']}",
             f"paddle {env['paddle']}, {env['device']}, {env['cpu_cores']} cores, cpu_threads={env['cpu_threads']}, "
             f"load average {env['load_average_1m']} at start and {env.get('load_average_1m_end', '?')} at the end "
             f"(1 min), {env['time']}, {env.get('seconds', '?')} s", "", table(result["rows"])]
    for key in ("pipeline", "runtimes", "peaks", "memory", "layers"):
        if result.get(key):
            parts += ["", table(result[key])]
    if result.get("summary"):
        parts += ["", table([result["summary"]])]
    if result.get("trainer_parts_us"):
        parts += ["", table([{"Trainer step part": part, "us per step": us}
                             for part, us in result["trainer_parts_us"].items()])]
    for goal in result.get("goals", []):
        interval = goal.get("interval")
        within = (f"; 95% interval {format_value(interval[0])}-{format_value(interval[1])}" if interval else "")
        parts.append(f"- goal {goal['goal']}: measured {format_value(goal['measured'])} "
                     f"({'met' if goal['met'] else 'NOT met'}{within})")
    parts += [f"- {note}" for note in result.get("notes", [])]
    return "\n".join(parts) + "\n"


def write_report(result: dict[str, Any], out: Path) -> Path:
    """Write ``out`` (JSON) and the markdown beside it (same name, ``.md``); returns the markdown path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    markdown = out.with_suffix(".md")
    markdown.write_text(to_markdown(result))
    return markdown
