"""ModelEMA: the average it keeps, validation with it, and its state across a checkpoint."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrain.callbacks import Callback, ModelEMA
from paddletrain.checkpoint import load_checkpoint, save_checkpoint
from paddletrain.engine.limits import Limits
from paddletrain.engine.trainer import Trainer
from tests.test_engine_trainer import linear_model, make_batches, sgd


def test_ema_tracks_the_average_of_the_weights_after_each_step():
    model = linear_model()
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    history = []

    class Record(Callback):
        def on_train_batch_end(self, trainer, output, batch, batch_idx):
            history.append({k: v.numpy().copy() for k, v in trainer.module.state_dict().items()})

    ema = ModelEMA(decay=0.5, validate_with_ema=False)
    Trainer(model, sgd(model), callbacks=[Record(), ema], limits=Limits(max_epochs=1)).fit(make_batches(4, 8))
    expected = initial
    for weights in history:
        expected = {k: 0.5 * expected[k] + 0.5 * weights[k] for k in expected}
    for key, value in expected.items():
        np.testing.assert_allclose(ema.shadow[key].numpy(), value, rtol=1e-6)


def test_validation_uses_the_ema_weights_and_restores_the_trained_ones():
    model = linear_model()
    ema = ModelEMA(decay=0.9)
    data = make_batches(4, 8)
    trainer = Trainer(model, sgd(model), callbacks=[ema], limits=Limits(max_epochs=2), num_classes=3)
    trainer.fit(data, data)
    trained = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    reported = trainer.validate(data)
    # The trained weights are back after validation...
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), trained[key])
    # ...and the reported metrics are those of a model holding the EMA weights.
    averaged = linear_model()
    averaged.set_state_dict(ema.shadow)
    direct = Trainer(averaged, sgd(averaged), num_classes=3).validate(data)
    assert reported == direct
    assert not np.allclose(ema.shadow["weight"].numpy(), trained["weight"])


def test_ema_state_survives_a_checkpoint(tmp_path):
    model = linear_model()
    ema = ModelEMA(decay=0.8)
    Trainer(model, sgd(model), callbacks=[ema], limits=Limits(max_epochs=1)).fit(make_batches(3, 8))
    save_checkpoint(tmp_path / "ckpt", {"ema": ema.state_dict()})
    restored = ModelEMA(decay=0.8)
    restored.load_state_dict(load_checkpoint(tmp_path / "ckpt").state["ema"])
    for key, value in ema.shadow.items():
        np.testing.assert_array_equal(restored.shadow[key].numpy(), value.numpy())
    assert isinstance(restored.shadow["weight"], paddle.Tensor)


def test_a_run_validated_with_ema_is_evaluated_and_exported_with_its_averaged_weights(tmp_path):
    """The run's best checkpoint was chosen on the averaged weights, so evaluate and export take them unless told
    weights=raw; each record says which."""
    import json

    from tests.conftest import TINY, evaluated, fit_tiny, run_module

    run_dir, summary = fit_tiny(tmp_path, "callbacks=[default,ema]", "callbacks.ema.decay=0.5")
    validated = summary["val/loss"]
    averaged, raw, flipped = (evaluated(f"{run_dir}:last", *extra, cwd=tmp_path)
                              for extra in ((), ("weights=raw",), ("tta.flip=true",)))
    assert averaged["weights"] == "averaged" and averaged["average"] == "ema" and averaged["decay"] == 0.5
    assert averaged["val/loss"] == pytest.approx(validated, rel=1e-5)  # what the run reported for this checkpoint
    assert raw["weights"] == "raw" and abs(raw["val/loss"] - validated) > 1e-3  # a 0.5 average of 4 steps differs
    assert averaged["tta"]["flip"] is False and flipped["tta"]["flip"] is True and flipped["tta"]["crops"] == 1
    for choice in ("auto", "raw"):
        out = tmp_path / f"export-{choice}"
        done = run_module("paddletrain.export", [f"checkpoint={run_dir}:last", f"out_dir={out}", f"weights={choice}"],
                          cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        meta = json.loads((out / "preprocess.json").read_text())
        assert meta["weights"] == ("averaged" if choice == "auto" else "raw") and meta["tta"] is None
    assert (tmp_path / "export-auto" / "model.pdiparams").read_bytes() != (
        tmp_path / "export-raw" / "model.pdiparams").read_bytes()
    plain = tmp_path / "plain"
    assert run_module("paddletrain.fit", [*TINY, f"hydra.run.dir={plain}"], cwd=tmp_path).returncode == 0
    refused = run_module("paddletrain.evaluate", [f"checkpoint={plain}:last", "weights=averaged"], cwd=tmp_path)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "holds no averaged weights" in said and "weights=raw" in said
    assert "Traceback" not in said


def test_a_warmed_up_ema_follows_the_weights_closely_at_first_and_resumes_its_count(tmp_path):
    """warmup: the n-th update uses min(decay, (1 + n) / (10 + n)), and a checkpoint carries n."""
    ema = ModelEMA(decay=0.99, warmup=True)
    assert ema.current_decay() == pytest.approx(0.1)  # the first update keeps 90% of the weights
    model = linear_model()
    data = make_batches(4, 8)
    Trainer(model, sgd(model), callbacks=[ema], limits=Limits(max_epochs=1), num_classes=3).fit(data)
    assert ema.updates == 4 and ema.current_decay() == pytest.approx(5 / 14)
    resumed = ModelEMA(decay=0.99, warmup=True)
    resumed.load_state_dict(ema.state_dict())
    assert resumed.updates == 4 and resumed.current_decay() == ema.current_decay()
    assert ModelEMA(decay=0.99).current_decay() == 0.99  # without warm-up, as before
