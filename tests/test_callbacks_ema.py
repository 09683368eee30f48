"""ModelEMA: the average it keeps, validation with it, and its state across a checkpoint."""
from __future__ import annotations

import numpy as np
import paddle

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
