"""decoded_batches: worker processes decode into shared memory, in input order, and clean up after themselves."""
from __future__ import annotations

import logging
import os

import numpy as np
import psutil
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data import preprocessing_info
from paddletrain.deploy import decoding
from paddletrain.deploy.decoding import decoded_batches, load_batch
from paddletrain.deploy.predictor import Preprocessing

SIZE = 16
INPUT = (3, SIZE, SIZE)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def preprocessing():
    return Preprocessing(preprocessing_info(OmegaConf.structured(DataConfig(image_size=SIZE))))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Eleven small JPEGs of different colours and sizes; the fifth is not an image."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(11):
        path = root / f"img_{i:02d}.jpg"
        if i == 4:
            path.write_bytes(b"not a jpeg")
        else:
            size = (20 + i, 24)
            Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


@pytest.fixture
def own_blocks(monkeypatch):
    """The names of the shared blocks this test's ``decoded_batches`` create. Only those are checked: /dev/shm
    is the machine's, and another pytest worker's ``predict`` run has its blocks there too (seen in CI)."""
    names: list[str] = []

    class Recorded(decoding._Blocks):
        def __init__(self, count, shape):
            super().__init__(count, shape)
            names.extend(self._by_name)

    monkeypatch.setattr(decoding, "_Blocks", Recorded)
    return names


def _still_there(names):
    return {name for name in names if os.path.exists(os.path.join(decoding.SHM_DIR, name))}


def _collect(chunks, preprocessing, workers):
    """(paths, a copy of the inputs, failures) per batch: arrays from workers are only valid until the next."""
    return [(ok, None if x is None else x.copy(), failed)
            for ok, x, failed in decoded_batches(chunks, preprocessing, workers, INPUT)]


def test_load_batch_skips_unreadable_files_and_names_them(files, preprocessing):
    ok, inputs, failures = load_batch(files[3:6], preprocessing)
    assert ok == [files[3], files[5]] and inputs.shape == (2, *INPUT) and inputs.dtype == np.float32
    [(path, reason)] = failures
    assert path == files[4] and "UnidentifiedImageError" in reason


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_give_the_same_batches_in_order_as_decoding_here(files, preprocessing, workers, own_blocks):
    chunks = [files[i:i + 4] for i in range(0, len(files), 4)]  # 4 + 4 + 3: the last batch is short
    expected = _collect(chunks, preprocessing, 0)
    got = _collect(chunks, preprocessing, workers)
    assert [ok for ok, _, _ in got] == [ok for ok, _, _ in expected]
    assert [len(ok) for ok, _, _ in got] == [4, 3, 3]  # files[4] is not an image
    for (_, x, failed), (_, y, expected_failed) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, y)
        assert failed == expected_failed
    assert own_blocks and not _still_there(own_blocks)  # every block unlinked


def test_abandoning_the_batches_early_still_unlinks_the_shared_blocks(files, preprocessing, own_blocks):
    batches = decoded_batches([files[i:i + 2] for i in range(0, 10, 2)], preprocessing, 2, INPUT)
    next(batches)
    assert len(_still_there(own_blocks)) == 2 * decoding.PREFETCH_PER_WORKER + 1
    batches.close()
    assert not _still_there(own_blocks)


class _DecodedBy:
    """A preprocessing whose every input holds the id of the process that decoded it."""

    def __call__(self, image):
        return np.full(INPUT, os.getpid(), np.float32)  # float32 holds Linux pids (< 2**22) exactly


def test_this_process_decodes_the_first_batch_and_the_workers_the_rest_then_exit(files):
    chunks = [files[i:i + 2] for i in range(6, 11, 2)] + [files[:2]]  # 2 + 2 + 1 + 2, all readable
    deciders = [{int(v) for v in np.unique(x)} for _, x, _ in _collect(chunks, _DecodedBy(), 2)]
    assert deciders[0] == {os.getpid()}  # ready without waiting for a worker to start
    workers = set().union(*deciders[1:])
    assert workers and os.getpid() not in workers
    # The generator does not wait for the workers to exit, but they do exit.
    _, alive = psutil.wait_procs(_processes(workers), timeout=10)
    assert alive == []


def _processes(pids):
    """The processes of ``pids`` still running."""
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_single_batch_is_decoded_here_without_starting_workers(files, preprocessing, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("a worker pool was started for one batch")

    monkeypatch.setattr(decoding, "ProcessPoolExecutor", no_pool)
    [(ok, x, _)] = _collect([files[:3]], preprocessing, 2)
    assert ok == files[:3]
    np.testing.assert_array_equal(x, load_batch(files[:3], preprocessing)[1])
    assert _collect([], preprocessing, 2) == []


def test_a_chunk_of_only_bad_files_gives_no_array(files, preprocessing):
    [(ok, inputs, failures)] = _collect([[files[4]]], preprocessing, 1)
    assert ok == [] and inputs is None and failures[0][0] == files[4]


def test_without_room_in_dev_shm_batches_are_pickled_and_the_log_says_so(files, preprocessing, monkeypatch, caplog):
    monkeypatch.setattr(decoding, "_shm_fits", lambda nbytes: False)
    chunks = [files[:4], files[4:8]]
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        got = _collect(chunks, preprocessing, 1)
    assert "--shm-size" in caplog.text
    for (_, x, _), (_, y, _) in zip(got, _collect(chunks, preprocessing, 0), strict=True):
        np.testing.assert_array_equal(x, y)


def test_decode_workers_are_pinned_to_the_last_cores_when_a_core_is_left(monkeypatch):
    monkeypatch.setattr(decoding.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert decoding._worker_cores(1) == [3] and decoding._worker_cores(2) == [2, 3]
    assert decoding._worker_cores(4) is None  # no core would be left for the predictor
