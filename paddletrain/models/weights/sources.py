"""Where pretrained weights come from: resolve a source string to arrays plus what the weights carry.

Sources:

* a local file: ``.safetensors`` (no code runs), or ``.pdparams`` read by the allow-list unpickler
  (:func:`paddletrain.checkpoint.safe_unpickle`: numpy arrays and containers only); a pickle that needs more
  is refused unless ``trust_pickle=True``;
* a paddletrain checkpoint directory (its ``model`` state);
* ``vision:<arch>``: paddle.vision's published ImageNet weights (URL and md5 from ``paddle.vision.models``);
* ``paddleclas:<ModelName>``: PaddleClas' published "legendary" ResNet weights (e.g. ``ResNet50_vd``,
  ``ResNet50_vd_ssld``); a file PaddleClas itself downloaded (``~/.paddleclas/weights``) is used as it is;
* ``hub:<module>``: a PaddleHub module's weights, through ``paddlehub`` when it is installed and imports, else
  (and always with ``PADDLETRAIN_OFFLINE=1``) from the module directory ``$HUB_HOME/modules/<module>``
  (``HUB_HOME`` defaults to ``~/.paddlehub``).

Downloads land where Paddle caches weights (``~/.cache/paddle/hapi/weights``, or ``$PADDLETRAIN_WEIGHTS_HOME``);
a cached file is used without network. With ``PADDLETRAIN_OFFLINE=1`` nothing is downloaded, and a missing
file is an error that names the exact path to put it at.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import paddle.vision.models as vision_models
from paddle.utils import download

from ...checkpoint import CheckpointError, PickleRefused, load_checkpoint, safe_unpickle
from ...checkpoint.tensors import read_metadata, read_tensors
from ...checkpoint.untrusted import (
    StateValueError,
    checked_int,
    checked_mapping,
    checked_number,
    checked_str_list,
    show,
)
from .report import PretrainedLoadError

__all__ = [
    "PREFIXES",
    "WeightsInfo",
    "describe",
    "hub_module_dir",
    "imagenet_label_names",
    "paddleclas_cache_dir",
    "read_state_dict",
    "read_weights",
    "weights_cache_dir",
]

log = logging.getLogger(__name__)

PREFIXES = ("vision:", "paddleclas:", "hub:")
SAFE_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pdparams",)
# Keys of a safetensors file's metadata written by paddletrain.models.save_pretrained.
META_PREPROCESSING = "paddletrain.preprocessing"
META_LABEL_NAMES = "paddletrain.label_names"

IMAGENET_PREPROCESSING: dict[str, Any] = {
    "input_size": (3, 224, 224),
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
    "interpolation": "bilinear",
    "crop_pct": 0.875,
}

_PADDLECLAS_URL = ("https://paddle-imagenet-models-name.bj.bcebos.com/dygraph/legendary_models/"
                   "{name}_pretrained.pdparams")
# PaddleClas legendary ResNets (ppcls/arch/backbone/legendary_models/resnet.py MODEL_URLS) that paddletrain
# builds, with the paddletrain model each fits. "_ssld" names are PaddleClas' use_ssld=True downloads.
PADDLECLAS_MODELS = {
    "ResNet18": "resnet18", "ResNet34": "resnet34", "ResNet50": "resnet50", "ResNet101": "resnet101",
    "ResNet152": "resnet152", "ResNet18_vd": "resnet18_vd", "ResNet34_vd": "resnet34_vd",
    "ResNet50_vd": "resnet50_vd", "ResNet101_vd": "resnet101_vd", "ResNet152_vd": "resnet152_vd",
    "ResNet34_vd_ssld": "resnet34_vd", "ResNet50_vd_ssld": "resnet50_vd", "ResNet101_vd_ssld": "resnet101_vd",
}


@dataclass
class WeightsInfo:
    """What a source is and what its weights carry, known without reading the tensors.

    Attributes:
        source: the source string as given.
        kind: ``file``, ``checkpoint``, ``vision``, ``paddleclas`` or ``hub``.
        path: the local file or directory (for downloads: where the cached file is, or will be).
        url / md5: where a downloadable source comes from (md5 when the publisher gives one).
        preprocessing: ``input_size``, ``mean``, ``std``, ``interpolation``, ``crop_pct`` (those known).
        label_names: the classes of the weights' head, when the source says.
        architecture: the paddletrain model the weights were made for, when known.
        model_options: builder options the weights need (e.g. ``project_first_shortcut`` for PaddleClas'
            ResNet18/34/50, whose first block has a projection shortcut).
    """

    source: str
    kind: str
    path: Path | None = None
    url: str | None = None
    md5: str | None = None
    preprocessing: dict[str, Any] = field(default_factory=dict)
    label_names: list[str] | None = None
    architecture: str | None = None
    model_options: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- locations
def weights_cache_dir() -> Path:
    """Where downloaded weights are cached: ``$PADDLETRAIN_WEIGHTS_HOME``, else Paddle's weights cache."""
    override = os.environ.get("PADDLETRAIN_WEIGHTS_HOME")
    if override:
        return Path(override).expanduser()
    return Path(download.WEIGHTS_HOME)


def paddleclas_cache_dir() -> Path:
    """PaddleClas' own download cache, ``~/.paddleclas/weights`` (``ppcls.utils.download.WEIGHTS_HOME``)."""
    return Path("~/.paddleclas/weights").expanduser()


def hub_module_dir(name: str) -> Path:
    """PaddleHub's directory for module ``name``: ``$HUB_HOME/modules/<name>`` (``HUB_HOME``: ``~/.paddlehub``)."""
    return Path(os.environ.get("HUB_HOME") or "~/.paddlehub").expanduser() / "modules" / name


def _offline() -> bool:
    return os.environ.get("PADDLETRAIN_OFFLINE", "").lower() in ("1", "true", "yes")


def imagenet_label_names() -> list[str] | None:
    """The 1000 ImageNet class names from the installed ``paddleclas`` package, or None without it."""
    spec = importlib.util.find_spec("paddleclas")  # finds the package without importing it (opencv, sklearn)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "ppcls" / "utils" / "imagenet1k_label_list.txt"
    if not path.is_file():
        return None
    # Lines are "<index> <name>".
    names = [line.split(" ", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines() if " " in line]
    return names if len(names) == 1000 else None


# ---------------------------------------------------------------------------------------------- describe
def describe(source: str) -> WeightsInfo:
    """Identify ``source`` and what it carries, without reading tensors or downloading.

    Raises:
        PretrainedLoadError: an unknown ``prefix:``, an unknown vision/PaddleClas name, a missing local path.
    """
    source = str(source)
    if source.startswith("vision:"):
        return _describe_vision(source, source[len("vision:"):])
    if source.startswith("paddleclas:"):
        return _describe_paddleclas(source, source[len("paddleclas:"):])
    if source.startswith("hub:"):
        name = source[len("hub:"):]
        directory = hub_module_dir(name)
        labels = directory / "label_list.txt"
        return WeightsInfo(source, "hub", path=directory, preprocessing=dict(IMAGENET_PREPROCESSING),
                           label_names=_read_lines(labels) if labels.is_file() else None,
                           architecture=None)
    path = Path(source).expanduser()
    if not path.exists():
        head, sep, _ = source.partition(":")
        if sep and head.isidentifier() and len(head) > 1:
            raise PretrainedLoadError(f"Unknown weight source {source!r}: expected a file, a checkpoint directory "
                                      f"or one of the prefixes {', '.join(PREFIXES)}")
        raise PretrainedLoadError(f"Pretrained weight file not found: {source!r}")
    if path.is_dir():
        return _describe_checkpoint(source, path)
    info = WeightsInfo(source, "file", path=path)
    if path.suffix.lower() in SAFE_SUFFIXES:
        _read_safetensors_metadata(path, info)
    return info


def _describe_vision(source: str, arch: str) -> WeightsInfo:
    urls = _vision_model_urls()
    for key in (arch, f"{arch.replace('mobilenet_v', 'mobilenetv')}_1.0", f"{arch}_x1.0"):
        if key in urls:
            url, md5 = urls[key]
            break
    else:
        raise PretrainedLoadError(f"vision:{arch}: paddle.vision publishes no weights under that name; "
                                  f"available: {', '.join(sorted(urls))}")
    size = 299 if arch.startswith("inception") else 224
    return WeightsInfo(source, "vision", path=weights_cache_dir() / url.rsplit("/", 1)[-1], url=url, md5=md5,
                       preprocessing={**IMAGENET_PREPROCESSING, "input_size": (3, size, size)},
                       label_names=imagenet_label_names(), architecture=arch)


def _vision_model_urls() -> dict[str, tuple[str, str | None]]:
    """``{name: (url, md5)}`` from every ``paddle.vision.models`` module's ``model_urls``."""
    found: dict[str, tuple[str, str | None]] = {}
    for module_info in pkgutil.iter_modules(vision_models.__path__):
        module = importlib.import_module(f"{vision_models.__name__}.{module_info.name}")
        for name, entry in getattr(module, "model_urls", {}).items():
            url, md5 = (entry[0], entry[1]) if isinstance(entry, (tuple, list)) else (entry, None)
            found[name] = (url, md5)
    return found


def _describe_paddleclas(source: str, name: str) -> WeightsInfo:
    if name not in PADDLECLAS_MODELS:
        raise PretrainedLoadError(f"paddleclas:{name}: not a PaddleClas ResNet that paddletrain can build; "
                                  f"available: {', '.join(PADDLECLAS_MODELS)}")
    url = _PADDLECLAS_URL.format(name=name)
    architecture = PADDLECLAS_MODELS[name]
    # PaddleClas gives every ResNet a projection shortcut in its first block; the vd builders always have one.
    options = {} if architecture.endswith("_vd") else {"project_first_shortcut": True}
    file_name = url.rsplit("/", 1)[-1]
    ours, theirs = weights_cache_dir() / file_name, paddleclas_cache_dir() / file_name
    # A PaddleClas user already has the file where ppcls downloaded it (same URL, same name): no second copy.
    path = theirs if not ours.is_file() and theirs.is_file() else ours
    return WeightsInfo(source, "paddleclas", path=path, url=url,
                       preprocessing=dict(IMAGENET_PREPROCESSING), label_names=imagenet_label_names(),
                       architecture=architecture, model_options=options)


def _describe_checkpoint(source: str, path: Path) -> WeightsInfo:
    if not (path / "manifest.json").is_file():
        raise PretrainedLoadError(f"{source!r} is a directory but not a paddletrain checkpoint (no manifest.json); "
                                  f"give a .safetensors/.pdparams file or a checkpoint directory")
    try:
        state = load_checkpoint(path, map_numpy=True).state
    except CheckpointError as err:
        raise PretrainedLoadError(f"Cannot read checkpoint {source!r}: {err}") from err
    info = WeightsInfo(source, "checkpoint", path=path)
    config = state.get("config") if isinstance(state, Mapping) else None
    data = config.get("data") if isinstance(config, Mapping) else None
    if isinstance(data, Mapping) and data.get("image_size") and data.get("mean") and data.get("std"):
        try:
            info.preprocessing = _checkpoint_preprocessing(data)
        except StateValueError as err:
            raise PretrainedLoadError(f"Checkpoint {source!r}: {err}") from err
    run = state.get("run") if isinstance(state, Mapping) else None
    architecture = run.get("model") if isinstance(run, Mapping) else None
    info.architecture = architecture if isinstance(architecture, str) else None
    return info


def _checkpoint_preprocessing(data: Mapping) -> dict[str, Any]:
    """The eval preprocessing a checkpoint's resolved ``data`` config describes, checked like a file's."""
    key = "config.data"
    found = checked_preprocessing({"mean": data["mean"], "std": data["std"],
                                   "interpolation": data.get("interpolation", "bilinear")}, key)
    size = checked_int(data["image_size"], f"{key}.image_size", minimum=1, maximum=1 << 16)
    found["input_size"] = (len(found["mean"]), size, size)
    if data.get("eval_resize"):
        resize = checked_int(data["eval_resize"], f"{key}.eval_resize", minimum=size, maximum=1 << 16)
        found["crop_pct"] = size / resize
    return found


def _read_safetensors_metadata(path: Path, info: WeightsInfo) -> None:
    try:
        metadata = read_metadata(path)
    except CheckpointError as err:
        raise PretrainedLoadError(f"Cannot read safetensors weights: {err}") from err
    try:
        if META_PREPROCESSING in metadata:
            info.preprocessing = checked_preprocessing(json.loads(metadata[META_PREPROCESSING]))
        if META_LABEL_NAMES in metadata:
            info.label_names = checked_str_list(json.loads(metadata[META_LABEL_NAMES]), META_LABEL_NAMES)
    except (json.JSONDecodeError, RecursionError) as err:
        raise PretrainedLoadError(f"{str(path)!r}: corrupt paddletrain metadata ({err})") from err
    except StateValueError as err:
        raise PretrainedLoadError(f"{str(path)!r}: metadata {err}") from err


def checked_preprocessing(data: Any, key: str = META_PREPROCESSING) -> dict[str, Any]:
    """The preprocessing a weight file or checkpoint carries, every value of the type ``fit`` uses it as.

    Raises:
        StateValueError: naming the key (``paddletrain.preprocessing.mean``) and the bad value.
    """
    data = dict(checked_mapping(data, key))
    size = data.get("input_size")
    if size is not None:
        if not isinstance(size, (list, tuple)) or len(size) != 3:
            raise StateValueError(f"{key}.input_size", f"is {show(size)}: expected [channels, height, width]")
        data["input_size"] = tuple(checked_int(v, f"{key}.input_size[{i}]", minimum=1, maximum=1 << 16)
                                   for i, v in enumerate(size))
    for name in ("mean", "std"):
        values = data.get(name)
        if values is not None:
            if not isinstance(values, (list, tuple)) or not 1 <= len(values) <= 64:
                raise StateValueError(f"{key}.{name}", f"is {show(values)}: expected a list of 1 to 64 numbers")
            data[name] = tuple(checked_number(v, f"{key}.{name}[{i}]", finite=True) for i, v in enumerate(values))
    if any(v == 0 for v in data.get("std") or ()):
        raise StateValueError(f"{key}.std", f"is {show(data['std'])}: a standard deviation cannot be 0")
    if data.get("interpolation") is not None and not isinstance(data["interpolation"], str):
        raise StateValueError(f"{key}.interpolation", f"is {show(data['interpolation'])}: expected a string")
    if data.get("crop_pct") is not None:
        crop = checked_number(data["crop_pct"], f"{key}.crop_pct", finite=True)
        if not 0 < crop <= 1:
            raise StateValueError(f"{key}.crop_pct", f"is {show(data['crop_pct'])}: expected a number in (0, 1]")
    return data


def _read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- read
def read_weights(source: str, trust_pickle: bool = False) -> tuple[dict[str, np.ndarray], WeightsInfo]:
    """The arrays of ``source`` (downloading into the cache if needed) and its :class:`WeightsInfo`.

    Raises:
        PretrainedLoadError: the source is unknown, missing (offline: the message names the path to put the
            file at), corrupt, or a pickle that needs ``trust_pickle``.
    """
    info = describe(source)
    if info.kind in ("vision", "paddleclas"):
        path = _cached_download(info)
        return read_state_dict(str(path), trust_pickle=trust_pickle), info
    if info.kind == "hub":
        return _read_hub(info, trust_pickle), info
    if info.kind == "checkpoint":
        state = load_checkpoint(info.path, map_numpy=True).state
        if not isinstance(state.get("model"), Mapping):
            raise PretrainedLoadError(f"Checkpoint {source!r} holds no model state")
        return {k: np.asarray(v) for k, v in state["model"].items()}, info
    return read_state_dict(str(info.path), trust_pickle=trust_pickle), info


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cached_download(info: WeightsInfo) -> Path:
    path = info.path
    assert path is not None and info.url is not None
    where = f"download {info.url} and put it at {path}" + (f" (md5 {info.md5})" if info.md5 else "")
    if info.kind == "paddleclas":
        where += f" or in PaddleClas' own cache {paddleclas_cache_dir()}"
    if path.is_file():
        if info.md5 and _md5(path) != info.md5:
            raise PretrainedLoadError(f"{info.source}: the cached file {path} has md5 {_md5(path)}, expected "
                                      f"{info.md5} (a partial or different file); delete it, or {where}")
        return path
    if _offline():
        raise PretrainedLoadError(f"{info.source}: not in the cache and PADDLETRAIN_OFFLINE is set; {where}")
    try:
        fetched = download.get_path_from_url(info.url, str(path.parent), info.md5, decompress=False)
    except Exception as err:  # network errors surface as many types (requests, OSError, RuntimeError)
        raise PretrainedLoadError(f"{info.source}: download failed ({type(err).__name__}: {err}); offline? "
                                  f"{where[0].upper()}{where[1:]}") from err
    return Path(fetched)


def _read_hub(info: WeightsInfo, trust_pickle: bool) -> dict[str, np.ndarray]:
    """A hub module's weights: through paddlehub when it is installed and works, else from the module directory.

    The directory is read without paddlehub when paddlehub is absent, when it cannot even be imported (a
    protobuf too new for its generated code raises "Descriptors cannot be created directly"), and with
    ``PADDLETRAIN_OFFLINE=1`` (``paddlehub.Module`` asks the hub server about a module it does not have).
    """
    name = info.source[len("hub:"):]
    directory = info.path
    assert directory is not None
    why_not = _why_not_paddlehub()
    if why_not is None:
        return _read_hub_with_paddlehub(info, name)
    if not directory.is_dir():
        raise PretrainedLoadError(
            f"{info.source}: PaddleHub module {name!r} is not installed at {directory} ({why_not}). Run "
            f"`hub install {name}` where paddlehub works and copy the module directory to {directory}, or set "
            f"HUB_HOME to the PaddleHub home that holds modules/{name}."
        )
    if why_not.startswith("paddlehub cannot be imported"):
        log.warning("%s: %s; reading the module directory %s instead", info.source, why_not, directory)
    files = sorted(directory.glob("*.pdparams")) + sorted(directory.glob("*.safetensors"))
    if len(files) != 1:
        found = ", ".join(p.name for p in files) or "none"
        raise PretrainedLoadError(f"{info.source}: expected one .pdparams weight file in {directory}, found {found}")
    return read_state_dict(str(files[0]), trust_pickle=trust_pickle)


def _why_not_paddlehub() -> str | None:
    """None when paddlehub can load modules here, else why the module directory is read directly."""
    if _offline():
        return "PADDLETRAIN_OFFLINE is set, so paddlehub, which may contact its server, is not used"
    if importlib.util.find_spec("paddlehub") is None:
        return "paddlehub is not installed"
    try:
        importlib.import_module("paddlehub")
    except Exception as err:  # a broken install fails with whatever its dependencies raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return f"paddlehub cannot be imported ({type(err).__name__}: {first})"
    return None


def _read_hub_with_paddlehub(info: WeightsInfo, name: str) -> dict[str, np.ndarray]:
    import paddlehub  # optional dependency: only hub: sources need it

    try:
        # A module names its parameters from Paddle's global name counter and loads its weights by those names:
        # a fresh name scope gives the second module of a process the same names as the first.
        with paddle.utils.unique_name.guard():
            module = paddlehub.Module(name=name)
    except Exception as err:  # paddlehub raises its own types for a missing/broken module
        raise PretrainedLoadError(f"{info.source}: paddlehub could not load module {name!r}: {err}") from err
    if not isinstance(module, paddle.nn.Layer):
        raise PretrainedLoadError(f"{info.source}: module {name!r} is not a dygraph model (PaddleHub 1.x static "
                                  f"modules are not supported)")
    if getattr(module, "labels", None):
        info.label_names = list(module.labels)
    if getattr(module, "directory", None):
        info.path = Path(module.directory)
    return {k: v.numpy() for k, v in module.state_dict().items()}


def read_state_dict(path: str, trust_pickle: bool = False) -> dict[str, np.ndarray]:
    """Read a local weight file into a dict of numpy arrays.

    ``.safetensors`` runs no code. ``.pdparams`` is read by the allow-list unpickler first (only numpy arrays
    and containers, which is all a ``paddle.save``'d state dict holds); a pickle that references anything
    else is loaded with ``paddle.load`` only when ``trust_pickle`` (unpickling can run code from the file).

    Raises:
        PretrainedLoadError: a missing file, an unsupported suffix, a refused or unreadable pickle.
    """
    if not os.path.isfile(path):
        raise PretrainedLoadError(f"Pretrained weight file not found: {path!r}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in SAFE_SUFFIXES:
        try:
            return read_tensors(path)
        except CheckpointError as err:
            raise PretrainedLoadError(f"Cannot read safetensors weights: {err}") from err
    if suffix in PICKLE_SUFFIXES:
        return _read_pickle(path, trust_pickle)
    supported = ", ".join(SAFE_SUFFIXES + PICKLE_SUFFIXES)
    raise PretrainedLoadError(f"Unsupported weight file {path!r}: expected one of {supported}, or a checkpoint "
                              f"directory")


def _read_pickle(path: str, trust_pickle: bool) -> dict[str, np.ndarray]:
    try:
        state = safe_unpickle(path)
    except CheckpointError as err:
        # Only a callable outside the allow-list can be let through by trust; a structure that is not a plain
        # tree of arrays (shared references, absurd depth or size) is refused whatever the trust.
        if not (isinstance(err, PickleRefused) and err.needs_trust):
            raise PretrainedLoadError(f"Cannot read pickled weights: {err}") from err
        if not trust_pickle:
            raise PretrainedLoadError(
                f"{path!r} is a pickle that holds more than arrays ({err}); unpickling it can run code from the "
                f"file. If you trust it, pass trust_pickle=True (config: model.trust_pickle=true), or convert it "
                f"once to .safetensors."
            ) from err
        state = _paddle_load(path)
    if not isinstance(state, Mapping):
        raise PretrainedLoadError(f"{path!r} holds a {type(state).__name__}, not a dict of weights.")
    arrays = {}
    for key, value in state.items():
        value = value.numpy() if hasattr(value, "numpy") else value
        if not isinstance(value, np.ndarray):
            raise PretrainedLoadError(f"{path!r}: entry {key!r} is a {type(value).__name__}, not an array; "
                                      f"expected a state dict of weights")
        arrays[str(key)] = value
    return arrays


def _paddle_load(path: str) -> Any:
    try:
        return paddle.load(path)
    except Exception as err:  # paddle.load raises many types for a corrupt pickle
        raise PretrainedLoadError(f"Cannot read pickled weights {path!r}: {err}") from err
