"""The Trainer's declared hooks: the data pipeline's classes fulfil them, and the Trainer calls them by contract."""
from __future__ import annotations

import numpy as np
import paddle

from paddletrain.config import DataConfig
from paddletrain.data.loading.loaders import build_loader
from paddletrain.data.transforms.mixup import Mixup
from paddletrain.engine.hooks import EpochSampler, PaddedLoader, SkippingSampler, Stateful, batch_sampler_of
from paddletrain.engine.limits import Limits
from paddletrain.engine.trainer import Trainer
from tests.test_engine_trainer import linear_model, make_batches, sgd


class Vectors(paddle.io.Dataset):
    def __init__(self, n: int = 12):
        rng = np.random.RandomState(0)
        self.x = rng.randn(n, 8).astype("float32")
        self.y = rng.randint(0, 3, n).astype("int64")

    def __getitem__(self, index):
        return self.x[index], self.y[index]

    def __len__(self):
        return len(self.y)


class EpochAndSkipSampler(paddle.io.BatchSampler):
    """A user's sampler with the epoch and skip hooks but no state of its own."""

    def __init__(self, dataset, batch_size):
        super().__init__(dataset=dataset, batch_size=batch_size)
        self.epochs, self.skips = [], []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def skip_batches(self, n):
        self.skips.append(n)


def test_the_pipelines_own_classes_fulfil_the_hooks():
    loader = build_loader(Vectors(), DataConfig(batch_size=4, num_workers=0), train=True, seed=0)
    sampler = batch_sampler_of(loader)
    assert isinstance(sampler, EpochSampler) and isinstance(sampler, SkippingSampler)
    assert isinstance(sampler, Stateful) and isinstance(loader, PaddedLoader)
    assert isinstance(Mixup(num_classes=3, mixup_alpha=0.2), Stateful)


def test_a_list_of_batches_fulfils_none():
    batches = make_batches(2, 4)
    assert batch_sampler_of(batches) is None
    assert not isinstance(batches, PaddedLoader) and not isinstance(batches, Stateful)


def test_the_trainer_calls_a_users_sampler_hooks_each_epoch_and_skips_on_a_mid_epoch_start():
    sampler = EpochAndSkipSampler(Vectors(), batch_size=4)
    assert isinstance(sampler, EpochSampler) and not isinstance(sampler, Stateful)
    loader = paddle.io.DataLoader(Vectors(), batch_sampler=sampler)
    model = linear_model()
    trainer = Trainer(model, sgd(model), limits=Limits(max_epochs=2), handle_signals=False)
    trainer.fit(loader)
    assert sampler.epochs == [0, 1] and sampler.skips == []
    assert "sampler" not in trainer.state_dict()  # not Stateful: nothing to save
    trainer.epoch, trainer.batch_in_epoch = 1, 2  # as a restored mid-epoch checkpoint leaves it
    trainer.fit(loader)
    assert sampler.epochs[-1] == 1 and sampler.skips == [2]
