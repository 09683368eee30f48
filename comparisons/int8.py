"""Maintainers' int8 measurement: which calibration algorithm, which layers kept fp32, which ONNX form.

For a training checkpoint, exports int8 once per setting (Paddle: each algorithm, with and without the first
convolution and classifier kept fp32; ONNX: each algorithm onnxruntime has, QDQ and QOperator; with
``--reduce-range`` each default-ends setting again with ``quant_reduce_range=true``), then on the
checkpoint's whole validation split reports each export's top-1 accuracy, its difference from the checkpoint
(fp32 dygraph) and its top-1 agreement with it, and its speed against the fp32 predictor of the same runtime at
one batch size (windows interleaved, median of window ratios, so a busy machine slows both alike). With
``--simulate`` each Paddle export gets a second row, its int8 program simulated in fp32
(``paddletrain.deploy.quantize.simulated_logits``): what calibration loses, apart from what this CPU's int8 kernels add.
``--train-images N`` also counts top-1 flips against the checkpoint on N training images, a finer count than a
small validation split gives. ``--bias-correction both`` adds each Paddle setting again with
``quant_bias_correction=false``; ``--weights-only`` adds the checkpoint with only its weights rounded to int8
(activations fp32), with and without bias correction. ``--calibration-seed S`` calibrates on
``--calibration-images`` training images drawn at random with seed S (written as PNG files), to see how much the
result depends on which images calibrate::

    python comparisons/int8.py --checkpoint outputs/<run>:best --calibration <train images> --out int8.json

Not part of the wheel: it compares settings for the defaults in paddletrain.deploy.quantize / paddletrain.export.
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from paddletrain.bench.common import interleave, paired_ratio, timed
from paddletrain.deploy.exporter import export_checkpoint, reference_logits
from paddletrain.deploy.predictor import OnnxPredictor, Predictor
from paddletrain.deploy.quantize import ONNX_CALIBRATION, QUANT_ALGOS, simulated_logits
from paddletrain.rebuild import rebuild_checkpoint


def _inputs(rebuilt: Any, limit: int, train_images: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``limit`` validation images then ``train_images`` training images, and the validation labels."""
    val, train = rebuilt.splits.val, rebuilt.splits.train
    picks = range(min(len(val), limit))
    extra = range(min(len(train), train_images))
    images = [rebuilt.eval_transform(val.load_image(i)) for i in picks]
    images += [rebuilt.eval_transform(train.load_image(i)) for i in extra]
    return np.stack(images), np.asarray([val.targets[i] for i in picks])


def _speed(fp32: Any, int8: Any, batch: np.ndarray, windows: int) -> float:
    """int8 images/s over fp32 images/s at ``len(batch)``, interleaved windows of ~64 images."""
    steps = max(1, math.ceil(64 / len(batch)))

    def arm(predictor: Any):
        return lambda n: timed(lambda: [predictor.predict(batch) for _ in range(n)])

    seconds = interleave({"fp32": arm(fp32), "int8": arm(int8)}, windows, steps, warmup=2)
    return paired_ratio(seconds["fp32"], seconds["int8"])


def _random_calibration(rebuilt: Any, count: int, seed: int, folder: Path) -> Path:
    """``count`` training images of the checkpoint's own split, drawn with ``seed``, as PNG files in ``folder``."""
    from PIL import Image

    train = rebuilt.splits.train
    folder.mkdir(parents=True, exist_ok=True)
    for i in np.random.default_rng(seed).choice(len(train), min(count, len(train)), replace=False):
        pixels = np.asarray(train.load_image(int(i)))
        if pixels.ndim == 3 and pixels.shape[2] == 1:  # grayscale HW1: PIL takes it as HW
            pixels = pixels[..., 0]
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return folder


def _row(name: str, logits: np.ndarray, reference: np.ndarray, labels: np.ndarray, speed: float,
         seconds: float) -> dict[str, Any]:
    """Accuracy and agreement on the validation images (the first ``len(labels)``); flips and the logit error
    (mean absolute logit difference over the mean absolute reference logit) on every image."""
    top1, ref = logits.argmax(1), reference.argmax(1)
    val, val_ref = top1[:len(labels)], ref[:len(labels)]
    return {"setting": name, "top1": float(np.mean(val == labels)),
            "delta_points": 100 * float(np.mean(val == labels) - np.mean(val_ref == labels)),
            "agreement": float(np.mean(val == val_ref)), "flips": int(np.sum(top1 != ref)), "images": len(top1),
            "logit_error": float(np.mean(np.abs(logits - reference)) / np.mean(np.abs(reference))),
            "speed_vs_fp32": speed, "export_seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--calibration", default=None, help="folder/list; default: the training split")
    parser.add_argument("--calibration-images", type=int, default=128)
    parser.add_argument("--calibration-seed", type=int, default=None,
                        help="calibrate on training images drawn at random with this seed (instead of --calibration)")
    parser.add_argument("--algos", default="hist,abs_max,mse,avg", help=f"of {','.join(QUANT_ALGOS)}")
    parser.add_argument("--onnx", action="store_true", help="also onnxruntime int8, QDQ and QOperator")
    parser.add_argument("--onnx-only", action="store_true", help="only the onnxruntime rows")
    parser.add_argument("--reduce-range", action="store_true", help="also quant_reduce_range=true rows")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--max-images", type=int, default=10_000)
    parser.add_argument("--train-images", type=int, default=0, help="also count flips on this many training images")
    parser.add_argument("--simulate", action="store_true", help="also each Paddle int8 program simulated in fp32")
    parser.add_argument("--weights-only", action="store_true",
                        help="also the checkpoint with only its weights rounded to int8, with and without bias "
                             "correction")
    parser.add_argument("--bias-correction", choices=("on", "off", "both"), default="on",
                        help="Paddle exports with quant_bias_correction on (the default), off, or both")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    rebuilt = rebuild_checkpoint(args.checkpoint, None)
    inputs, labels = _inputs(rebuilt, args.max_images, args.train_images)
    reference = reference_logits(rebuilt.model, inputs)
    rows = [_row("checkpoint (fp32 dygraph)", reference, reference, labels, float("nan"), 0.0)]
    batch = inputs[:args.batch] if len(inputs) >= args.batch else np.resize(inputs, (args.batch, *inputs.shape[1:]))
    with tempfile.TemporaryDirectory() as tmp:
        if args.calibration_seed is not None:
            args.calibration = _random_calibration(rebuilt, args.calibration_images, args.calibration_seed,
                                                   Path(tmp) / "calibration")
        common = dict(calibration=args.calibration, calibration_images=args.calibration_images, check=False)
        fp32_dir = export_checkpoint(args.checkpoint, Path(tmp) / "fp32", check=False,
                                     format="onnx" if args.onnx or args.onnx_only else "paddle").out_dir
        fp32 = Predictor(fp32_dir)
        corrections = {"on": (True,), "off": (False,), "both": (True, False)}[args.bias_correction]
        settings = [(keep_ends, False, correct) for keep_ends in (True, False) for correct in corrections]
        settings += [(True, True, correct) for correct in corrections] if args.reduce_range else []
        for algo in [] if args.onnx_only else args.algos.split(","):
            for keep_ends, reduce_range, correct in settings:
                name = (f"paddle int8 {algo}{'' if keep_ends else ', every layer int8'}"
                        f"{', reduce_range' if reduce_range else ''}{'' if correct else ', no bias correction'}")
                start = _now()
                out = export_checkpoint(args.checkpoint, Path(tmp) / name.replace(" ", "_").replace(",", ""),
                                        precision="int8", quant_algo=algo, quant_keep_ends=keep_ends,
                                        quant_reduce_range=reduce_range, quant_bias_correction=correct,
                                        **common).out_dir
                seconds = _now() - start
                int8 = Predictor(out)
                rows.append(_row(name, int8.predict(inputs), reference, labels, _speed(fp32, int8, batch,
                                                                                          args.windows), seconds))
                print(json.dumps(rows[-1]), flush=True)
                if args.simulate:
                    rows.append(_row(f"{name}, simulated in fp32", simulated_logits(out, inputs), reference, labels,
                                     float("nan"), 0.0))
                    print(json.dumps(rows[-1]), flush=True)
        if args.weights_only:
            rows += _weights_only_rows(rebuilt, args, inputs, reference, labels)
        if args.onnx or args.onnx_only:
            rows += _onnx_rows(args, fp32_dir, Path(tmp), inputs, reference, labels, batch)
    result = {"checkpoint": args.checkpoint, "images": len(labels), "batch": args.batch, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"| setting | top1 | delta points | agreement | flips of {len(inputs)} | logit error | speed vs fp32 | "
          "export s |")
    for row in rows:
        print(f"| {row['setting']} | {row['top1']:.3f} | {row['delta_points']:+.1f} | {row['agreement']:.3f} | "
              f"{row['flips']} | {row['logit_error']:.3f} | {row['speed_vs_fp32']:.2f} | {row['export_seconds']:.0f} |")


def _weights_only_rows(rebuilt: Any, args: argparse.Namespace, inputs: np.ndarray, reference: np.ndarray,
                       labels: np.ndarray) -> list[dict[str, Any]]:
    """The checkpoint's model with only the weights int8 rounds rounded (activations fp32): what weight rounding
    alone costs, and what bias correction (on the export's calibration images) gives back."""
    from paddletrain.deploy.bias_correction import weight_rounding_corrected, weights_rounded
    from paddletrain.deploy.exporter import _calibration_set
    from paddletrain.deploy.quantize import calibration_files

    files = calibration_files(args.calibration) if args.calibration is not None else None
    calibration = _calibration_set(rebuilt, files, args.calibration, args.calibration_images).inputs
    model = rebuilt.model
    with weights_rounded(model, calibration):
        plain = reference_logits(model, inputs)
    with weight_rounding_corrected(model, calibration), weights_rounded(model, calibration):
        corrected = reference_logits(model, inputs)
    rows = [_row("checkpoint, int8-rounded weights only", plain, reference, labels, float("nan"), 0.0),
            _row("checkpoint, int8-rounded weights only, bias-corrected", corrected, reference, labels, float("nan"),
                 0.0)]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def _onnx_rows(args: argparse.Namespace, fp32_dir: Path, tmp: Path, inputs: np.ndarray, reference: np.ndarray,
               labels: np.ndarray, batch: np.ndarray) -> list[dict[str, Any]]:
    import paddletrain.deploy.quantize as quantize

    fp32 = OnnxPredictor(fp32_dir)
    rows = [_row("onnxruntime fp32", fp32.predict(inputs), reference, labels, 1.0, 0.0)]
    # export_checkpoint takes no ONNX form (QDQ is the product's choice), so the benchmark swaps quantize_onnx's
    # default for the QOperator rows.
    defaulted = [p.name for p in inspect.signature(quantize.quantize_onnx).parameters.values()
                 if p.default is not inspect.Parameter.empty]
    form_index = defaulted.index("quant_format")
    for algo in [a for a in args.algos.split(",") if a in ONNX_CALIBRATION]:
        for form in ("QDQ", "QOperator"):
            for reduce_range in (False, True) if args.reduce_range else (False,):
                original = quantize.quantize_onnx.__defaults__
                quantize.quantize_onnx.__defaults__ = (*original[:form_index], form, *original[form_index + 1:])
                start = _now()
                try:
                    out = export_checkpoint(args.checkpoint, tmp / f"onnx_{algo}_{form}_{reduce_range}", format="onnx",
                                            precision="int8", quant_algo=algo, check=False,
                                            quant_reduce_range=reduce_range, calibration=args.calibration,
                                            calibration_images=args.calibration_images)
                finally:
                    quantize.quantize_onnx.__defaults__ = original
                seconds = _now() - start
                int8 = OnnxPredictor(out.out_dir)
                name = f"onnxruntime int8 {algo} {form}{', reduce_range' if reduce_range else ''}"
                rows.append(_row(name, int8.predict(inputs), reference, labels, _speed(fp32, int8, batch,
                                                                                       args.windows), seconds))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _now() -> float:
    import time

    return time.perf_counter()


if __name__ == "__main__":
    main()
