"""The SampleIndex in loader workers: reading it over a whole epoch costs a worker next to no memory of its own,
where a Python list of the same samples is copied into each worker page by page."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from paddletrain.bench.million_files import TinyReader, TupleListReader, index_arrays, worker_memory
from paddletrain.data.formats.sample_index import SampleIndex

pytestmark = pytest.mark.timeout(300)

# 300k samples with 100-byte paths (nested folders, long names): an index of 29 MB, big enough that a list of the
# same samples visibly costs each worker most of its size.
SAMPLES = 300_000


class LabelWritingReader(TinyReader):
    """A reader that writes to the index (each label it reads, unchanged): what the measure must see as a copy."""

    def load_image(self, index: int) -> np.ndarray:
        self.index.labels[index] = self.index.labels[index]
        return super().load_image(index)


def _index() -> SampleIndex:
    names = [f"train/n{i % 1000:08d}/subset_{i % 7}/a_rather_long_file_name_as_some_datasets_have_{i:010d}.JPEG"
             for i in range(SAMPLES)]
    return SampleIndex.build("/nonexistent/root", names, np.arange(SAMPLES) % 1000)


def test_a_worker_copies_none_of_the_index_over_an_epoch_and_a_list_nearly_all_of_it():
    index = _index()
    classes = [str(i) for i in range(1000)]
    assert index.nbytes > 29 * 2**20
    gc.collect()
    workers = worker_memory(TinyReader(index, classes), num_workers := 2, 1024, index_arrays(index))
    assert len(workers) == num_workers
    if "arrays_held_alone_mb" not in workers[0]:
        pytest.skip("/proc/<pid>/pagemap cannot be read here: the index's own pages cannot be counted")
    for worker in workers:
        # The index's pages the worker holds alone, i.e. copied: none but at most a page at each array's ends,
        # which the heap may share with objects the worker writes. Its whole USS would also count what its
        # garbage collector and allocator touch elsewhere in the inherited heap (0.6-6 MB, depending on what the
        # test process did before), which is not what reading the index costs.
        assert worker["arrays_held_alone_mb"] * 2**20 <= 6 * os.sysconf("SC_PAGE_SIZE"), worker
    # The measure sees a copy: a reader that writes each label it reads copies the label pages.
    workers = worker_memory(LabelWritingReader(index, classes), num_workers, 1024, index_arrays(index))
    for worker in workers:
        assert worker["arrays_held_alone_mb"] * 2**20 > 0.5 * index.labels.nbytes, worker
    # And a list of (path, label) tuples is copied into each worker page by page as it is read (its reference
    # counts are written): the worker's own memory grows by most of the index's size.
    samples = [(index.path(i), int(label)) for i, label in enumerate(index.labels.tolist())]
    baseline = worker_memory(TupleListReader(samples, classes), num_workers, batch_size=1024)
    assert len(baseline) == num_workers
    for worker in baseline:
        assert worker["uss_growth_mb"] > 0.5 * index.nbytes / 2**20, worker
