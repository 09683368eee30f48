"""comparisons/shards.py: the shard loader against the image folder, locally and over loopback HTTP, and the
memory of its workers over an epoch (a small run: the structure and the arithmetic, not the speed)."""
from __future__ import annotations

import statistics

import pytest

from comparisons.shards import ShardsCompareConfig, run_shards
from paddletrain.bench.report import to_markdown
from paddletrain.errors import ConfigError


def test_every_arm_reads_the_whole_folder_and_the_ratios_come_from_its_passes():
    cfg = ShardsCompareConfig(num_images=48, source_size=48, image_size=16, transform="small", batch_size=8,
                              num_workers=1, rounds=2, memory_passes=2, shard_size_mb=0.05)
    result = run_shards(cfg)
    rows = {row["arm"]: row for row in result["rows"]}
    assert set(rows) == {"folder", "shards", "http_cold", "http_cold_no_ahead", "http_cached"}
    assert all(row["passes"] == 2 and row["images_per_s"] > 0 and row["first_batch_s"] > 0 for row in rows.values())
    summary = result["summary"]
    assert summary["images"] == 48 and summary["shards"] > 1 and summary["pack_images_per_s"] > 0
    # A ratio is the median of per-round ratios: between the smallest and the largest such ratio.
    assert 0 < summary["shards_vs_folder"] < 100 and summary["http_cached_vs_shards"] > 0
    assert summary["http_cold_vs_http_cold_no_ahead"] > 0  # fetch-ahead's own effect, from the same rounds
    memory = result["memory"]
    assert memory[-1]["share_of_epoch"] == 1 and memory[0]["share_of_epoch"] < 0.2
    assert all(m["workers"] >= 1 and m["worker_uss_mb_max"] > 0 for m in memory)
    assert statistics.median(m["worker_uss_mb_max"] for m in memory) > 0
    text = to_markdown(result)
    assert "shards_vs_folder" in text and "worker_uss_mb_max" in text and "goal http_cached_vs_shards >= 0.9" in text


def test_an_unknown_arm_is_refused():
    with pytest.raises(ConfigError, match="arms="):
        run_shards(ShardsCompareConfig(arms=["floppy"], num_images=4))
