"""Fine-tune pretrained weights on an image folder (root/train/<class>/*, root/val/<class>/*).

    python examples/finetune.py /data/hymenoptera_data                                  # shufflenet, vision: weights
    python examples/finetune.py /data/flowers --model resnet50_vd --weights paddleclas:ResNet50_vd_ssld
    python examples/finetune.py /data/flowers --model resnet50_vd --weights hub:resnet50_vd_imagenet_ssld
    python examples/finetune.py /data/x --model vision --arch mobilenet_v2 --weights ./mobilenet_v2.pdparams

It first shows what loading the weights does (the load report), then trains through the same code path as
`python -m paddletrain.fit`, with the backbone frozen for the first epochs and BatchNorm statistics fixed.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from hydra import compose, initialize_config_module

import paddletrain.build
import paddletrain.fit  # noqa: F401  (registers the config schemas)
import paddletrain.models.vision  # noqa: F401  (registers model=vision)
from paddletrain.models import create_model, load_pretrained
from paddletrain.models.weights import describe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="image folder with train/ and val/")
    parser.add_argument("--model", default="vision", help="a paddletrain model name, or 'vision'")
    parser.add_argument("--arch", default="shufflenet_v2_x0_25", help="paddle.vision builder for --model vision")
    parser.add_argument("--weights", default="vision:shufflenet_v2_x0_25",
                        help="a file, checkpoint dir, vision:<arch>, paddleclas:<Name> or hub:<module>")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--freeze-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate of the backbone")
    parser.add_argument("--out", default="outputs/finetune_example")
    args = parser.parse_args()

    # 1. What the weights carry, and how they fit the model (a 2-class head is re-initialised on purpose).
    arch = {"arch": args.arch} if args.model == "vision" else {}
    info = describe(args.weights)
    print(f"{args.weights}: preprocessing {info.preprocessing}, "
          f"{len(info.label_names) if info.label_names else 'no'} label names")
    model = create_model(args.model, num_classes=2, **arch, **info.model_options)
    print(load_pretrained(model, args.weights))

    # 2. Train: data.* null -> input size, mean/std and interpolation from the weights.
    overrides = [
        f"model={args.model}", f"model.pretrained={args.weights}", "data=imagefolder", f"data.root={args.root}",
        "data.image_size=null", "data.mean=null", "data.std=null", "data.interpolation=null", "data.batch_size=16",
        "optim=adamw", f"optim.lr={args.lr}", "optim.head_lr_mult=10", "optim.weight_decay=0.01",
        "sched.warmup_epochs=0",
        f"trainer.max_epochs={args.epochs}", f"+callbacks.backbone_freeze.epochs={args.freeze_epochs}",
        "+callbacks.freeze_bn={}",
    ]
    if args.model == "vision":
        overrides.append(f"model.arch={args.arch}")
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        cfg = compose("fit", overrides=overrides)
    run_dir = Path(args.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics = paddletrain.build.train(cfg, run_dir)
    print(f"val/top1 {metrics.get('val/top1', float('nan')):.4f} (run dir: {run_dir})")


if __name__ == "__main__":
    main()
