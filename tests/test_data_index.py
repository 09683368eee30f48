"""The SampleIndex in loader workers: reading it over a whole epoch costs a worker next to no memory of its own,
where a Python list of the same samples is copied into each worker page by page."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from paddletrain.bench.million_files import TinyReader, TupleListReader, worker_memory
from paddletrain.data.formats.sample_index import SampleIndex

pytestmark = pytest.mark.timeout(300)

# 300k samples with 100-byte paths (nested folders, long names): an index of 29 MB, so the 10% bound (2.9 MB) is
# well above what a worker's own Python allocations and paddle's batch buffers add in an epoch (0.6-2.1 MB
# measured), and well below what copying the samples would cost.
SAMPLES = 300_000


def _index() -> SampleIndex:
    names = [f"train/n{i % 1000:08d}/subset_{i % 7}/a_rather_long_file_name_as_some_datasets_have_{i:010d}.JPEG"
             for i in range(SAMPLES)]
    return SampleIndex.build("/nonexistent/root", names, np.arange(SAMPLES) % 1000)


def test_each_worker_grows_by_less_than_a_tenth_of_the_index_over_an_epoch_a_list_by_much_more():
    index = _index()
    classes = [str(i) for i in range(1000)]
    assert index.nbytes > 29 * 2**20
    gc.collect()
    workers = worker_memory(TinyReader(index, classes), num_workers := 2, batch_size=1024)
    assert len(workers) == num_workers
    for worker in workers:  # USS: the pages the worker holds alone, i.e. the ones it wrote to
        assert worker["uss_growth_mb"] < 0.1 * index.nbytes / 2**20, worker
    # The measurement sees what it should: the same epoch over a list of (path, label) tuples copies most of them.
    samples = [(index.path(i), int(label)) for i, label in enumerate(index.labels.tolist())]
    baseline = worker_memory(TupleListReader(samples, classes), num_workers, batch_size=1024)
    assert len(baseline) == num_workers
    for worker in baseline:
        assert worker["uss_growth_mb"] > 0.5 * index.nbytes / 2**20, worker
