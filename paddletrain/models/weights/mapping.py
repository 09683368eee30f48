"""Convert the Paddle world's ResNet parameter names onto paddletrain's.

The same ResNet weights are published under four namings:

* ``paddletrain`` / paddle.vision: ``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer1.0.downsample.0``, ``fc``;
* ``paddleclas`` (PaddleClas "legendary" models): ``stem.N.conv|bn``, ``blocks.N.conv0|conv1|conv2.conv|bn``
  with blocks numbered straight through the stages, ``blocks.N.short.conv|bn``, ``fc``;
* ``paddlehub`` (PaddleHub modules, PaddleClas before 2.1): ``conv1_1._conv``, ``conv1_1._batch_norm`` (vd
  stem) or ``conv._conv`` (7x7 stem), ``bb_<stage>_<i>.conv0._conv``, ``bb_<stage>_<i>.short``, ``out``;
* ``static`` (static-graph parameter names): ``conv1_1_weights``, ``bnv1_1_scale``, ``res2a_branch2a_weights``,
  ``bn2a_branch2a_scale|_offset|_mean|_variance`` (a norm is "bn" + its conv's name from the 4th letter on),
  ``res2a_branch1_weights``, ``fc_0.w_0``, ``fc_0.b_0``.

Every scheme names the same units (a conv, a norm, the classifier) in the same layout, so the conversion is
driven by the model: each of its keys is translated into the name the source would use, and the scheme under
which most of the model's keys are found is the one the source uses. Shapes are untouched (all four store a
conv as ``[out, in, kh, kw]`` and a Linear as ``[in, out]``).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import paddle

from ..resnet import ResNet

__all__ = ["SCHEMES", "Conversion", "convert_state", "source_key"]

IDENTITY = "paddletrain"
SCHEMES = (IDENTITY, "paddleclas", "paddlehub", "static")

# Prefix of the classifier in each naming: unmatched source keys under it belong to the head.
HEAD_PREFIXES = {IDENTITY: ("fc.",), "paddleclas": ("fc.",), "paddlehub": ("out.",), "static": ("fc_0.",)}

# Where each naming keeps a projection shortcut of the first block of the first stage. PaddleClas' ResNets
# (and PaddleHub's) have one even when shapes match; paddle.vision's ResNet-18/34 do not. A paddletrain model
# built with project_first_shortcut=True has it.
FIRST_PROJECTION_PREFIXES = {IDENTITY: ("layer1.0.downsample.",), "paddleclas": ("blocks.0.short.",),
                             "paddlehub": ("bb_0_0.short.",), "static": ("res2a_branch1_", "bn2a_branch1_")}

_STATIC_BN_PARAMS = {"weight": "scale", "bias": "offset", "_mean": "mean", "_variance": "variance"}
_DEEP_STEM = {"conv1.0": (0, "conv"), "conv1.1": (0, "bn"), "conv1.3": (1, "conv"), "conv1.4": (1, "bn"),
              "conv1.6": (2, "conv"), "bn1": (2, "bn")}
_BASIC_STEM = {"conv1": (0, "conv"), "bn1": (0, "bn")}
_BLOCK = re.compile(r"layer(\d+)\.(\d+)\.(conv|bn)(\d)$")
_SHORTCUT = re.compile(r"layer(\d+)\.(\d+)\.downsample\.(\d)$")


@dataclass(frozen=True)
class Unit:
    """One conv / norm / classifier of a ResNet, independent of naming.

    ``kind`` is ``"conv"``, ``"bn"`` or ``"fc"``; ``part`` is ``"stem"`` (index = which stem conv),
    ``"block"`` (index = conv number in the block, from 0), ``"short"`` or ``"head"``.
    """

    part: str
    kind: str
    stage: int = 0
    block: int = 0
    index: int = 0


@dataclass(frozen=True)
class ResNetLayout:
    """What the conversion needs to know about a paddletrain ResNet."""

    depths: tuple[int, ...]
    deep_stem: bool
    shortcut_conv_index: int  # 0 for conv+norm shortcuts, 1 when an average pool comes first (vd)

    @classmethod
    def of(cls, model: paddle.nn.Layer) -> ResNetLayout | None:
        if not isinstance(model, ResNet):
            return None
        stages = [getattr(model, name) for name in model.stage_names]
        avg_down = any(len(b.downsample) == 3 for s in stages for b in s if b.downsample is not None)
        return cls(tuple(len(s) for s in stages), isinstance(model.conv1, paddle.nn.Sequential), int(avg_down))

    def flat_index(self, stage: int, block: int) -> int:
        return sum(self.depths[:stage]) + block


def parse_unit(prefix: str, layout: ResNetLayout) -> Unit | None:
    """The unit a paddletrain ResNet key prefix (the key without ``.weight`` etc.) names, or None."""
    stem = (_DEEP_STEM if layout.deep_stem else _BASIC_STEM).get(prefix)
    if stem is not None:
        return Unit("stem", stem[1], index=stem[0])
    if prefix == "fc":
        return Unit("head", "fc")
    match = _BLOCK.match(prefix)
    if match:
        stage, block, kind, number = match.groups()
        return Unit("block", kind, int(stage) - 1, int(block), int(number) - 1)
    match = _SHORTCUT.match(prefix)
    if match:
        stage, block, slot = map(int, match.groups())
        kind = "conv" if slot == layout.shortcut_conv_index else "bn"
        return Unit("short", kind, stage - 1, block)
    return None


def _paddleclas(unit: Unit, param: str, layout: ResNetLayout, numbered: bool) -> str:
    if unit.part == "head":
        return f"fc.{param}"
    if unit.part == "stem":
        return f"stem.{unit.index}.{unit.kind}.{param}"
    block = f"blocks.{layout.flat_index(unit.stage, unit.block)}"
    layer = "short" if unit.part == "short" else f"conv{unit.index}"
    return f"{block}.{layer}.{unit.kind}.{param}"


def _paddlehub(unit: Unit, param: str, layout: ResNetLayout, numbered: bool) -> str:
    sub = "_conv" if unit.kind == "conv" else "_batch_norm"
    if unit.part == "head":
        return f"out.{param}"
    if unit.part == "stem":
        stem = f"conv1_{unit.index + 1}" if layout.deep_stem else "conv"
        return f"{stem}.{sub}.{param}"
    layer = "short" if unit.part == "short" else f"conv{unit.index}"
    return f"bb_{unit.stage}_{unit.block}.{layer}.{sub}.{param}"


def _static_block_name(stage: int, block: int, numbered: bool) -> str:
    # ResNet-101/152 number the blocks of their long third stage: res4a, res4b1, res4b2, ...
    if numbered and stage == 2:
        return "res4a" if block == 0 else f"res4b{block}"
    return f"res{stage + 2}{chr(ord('a') + block)}"


def _static(unit: Unit, param: str, layout: ResNetLayout, numbered: bool) -> str:
    if unit.part == "head":
        return "fc_0.w_0" if param == "weight" else "fc_0.b_0"
    if unit.part == "stem":
        conv = f"conv1_{unit.index + 1}" if layout.deep_stem else "conv1"
    else:
        branch = "branch1" if unit.part == "short" else f"branch2{'abc'[unit.index]}"
        conv = f"{_static_block_name(unit.stage, unit.block, numbered)}_{branch}"
    if unit.kind == "conv":
        return f"{conv}_weights"
    norm = "bn_conv1" if conv == "conv1" else "bn" + conv[3:]
    return f"{norm}_{_STATIC_BN_PARAMS[param]}"


_FORMATTERS: dict[str, Callable[[Unit, str, ResNetLayout, bool], str]] = {
    "paddleclas": _paddleclas,
    "paddlehub": _paddlehub,
    "static": _static,
}


def source_key(key: str, scheme: str, layout: ResNetLayout | None, numbered: bool = False) -> str | None:
    """The name ``scheme`` gives the paddletrain key ``key``; None when the scheme has no such weight."""
    if scheme == IDENTITY:
        return key
    if layout is None:
        return None
    prefix, _, param = key.rpartition(".")
    unit = parse_unit(prefix, layout)
    if unit is None:
        return None
    return _FORMATTERS[scheme](unit, param, layout, numbered)


@dataclass
class Conversion:
    """A source state re-keyed onto the model: ``state`` uses the model's names, ``unmapped`` the source's."""

    scheme: str
    state: dict
    unmapped: list[str]


def convert_state(state: Mapping[str, object], model: paddle.nn.Layer) -> Conversion:
    """Re-key ``state`` onto ``model``'s parameter names, picking the scheme that explains most of them.

    Models other than paddletrain ResNets only take their own names (``paddletrain`` scheme). Ties go to the
    earlier scheme in :data:`SCHEMES`, so a paddletrain or paddle.vision file is never renamed.
    """
    layout = ResNetLayout.of(model)
    numbered = any(k.startswith("res4b1_") for k in state)
    targets = list(model.state_dict().keys())
    best: tuple[str, dict] | None = None
    for scheme in SCHEMES:
        names = {}
        for key in targets:
            name = source_key(key, scheme, layout, numbered)
            if name is not None and name in state:
                names[key] = name
        if best is None or len(names) > len(best[1]):
            best = (scheme, names)
    scheme, names = best
    used = set(names.values())
    return Conversion(
        scheme=scheme,
        state={key: state[name] for key, name in names.items()},
        unmapped=[k for k in state if k not in used],
    )
