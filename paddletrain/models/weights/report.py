"""The load report: what happened to every weight of a pretrained load, and the error strict loading raises."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import UserError

__all__ = ["LoadReport", "PretrainedLoadError", "abbreviate"]


class PretrainedLoadError(UserError):
    """Weights could not be found or read, or do not fit the model under ``strict`` loading."""


def abbreviate(items: list[str], limit: int = 10) -> str:
    """``a, b, c, ... (+N more)``: keeps long key lists readable in one line."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


@dataclass
class LoadReport:
    """What :func:`~paddletrain.models.load_pretrained` did with each weight.

    Keys in ``matched``, ``missing`` and ``shape_mismatched`` are the model's names; ``unexpected`` keys are
    the source's own names (they could not be mapped onto the model).

    Attributes:
        source: the weight source as given (``vision:resnet50``, a path, ...).
        path: the file or directory actually read.
        scheme: the parameter naming the source was converted from (see ``mapping.SCHEMES``).
        matched: model keys loaded from the source.
        missing: model keys absent from the source (they keep their fresh initialisation).
        unexpected: source keys the model has no place for (ignored).
        shape_mismatched: ``(key, source_shape, model_shape)`` for keys skipped because shapes differ.
        head_reinitialised: the classifier head was not loaded (another ``num_classes``, or absent) and keeps
            its fresh initialisation, on purpose.
        input_conv_adapted: ``"<key>: 3 -> N channels (<method>)"`` when the first conv was adapted to ``in_chans``.
    """

    source: str
    path: str = ""
    scheme: str = "paddletrain"
    matched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    head_reinitialised: bool = False
    input_conv_adapted: str | None = None

    def __str__(self) -> str:
        total = len(self.matched) + len(self.missing) + len(self.shape_mismatched)
        where = f" ({self.path})" if self.path and self.path != self.source else ""
        lines = [f"Loaded {len(self.matched)}/{total} weights from {self.source}{where} [naming: {self.scheme}]"]
        if self.head_reinitialised:
            lines.append("  classifier head: not loaded, freshly initialised (another num_classes, or absent)")
        if self.input_conv_adapted:
            lines.append(f"  first conv adapted: {self.input_conv_adapted}")
        for title, keys in (("missing", self.missing), ("unexpected", self.unexpected)):
            if keys:
                lines.append(f"  {title} ({len(keys)}): {abbreviate(keys)}")
        if self.shape_mismatched:
            items = [f"{k} {list(src)} vs model {list(dst)}" for k, src, dst in self.shape_mismatched]
            lines.append(f"  shape mismatched ({len(items)}): {abbreviate(items)}")
        return "\n".join(lines)
