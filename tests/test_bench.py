"""The benchmarks run on tiny cases and report sane fields. Speed itself is measured, never asserted."""
from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from comparisons.decode import DecodeBenchConfig, run_decode
from comparisons.overhead import ARMS, OverheadBenchConfig, run_overhead
from paddletrain.bench.common import median_interval, paired_ratio, paired_ratio_interval, parse_options, summarize
from paddletrain.bench.data import DataBenchConfig, run_data
from paddletrain.bench.inference import InferenceBenchConfig, run_inference
from paddletrain.bench.report import table, to_markdown
from paddletrain.bench.train import ThreadsBenchConfig, TrainBenchConfig, run_threads, run_train
from paddletrain.deploy.exporter import TOLERANCE
from paddletrain.deploy.predictor import cpu_bf16_support
from paddletrain.errors import ConfigError, UserError

from .conftest import run_module

TINY = dict(model="tiny", batch_size=4, image_size=8, windows=2, steps=2, warmup=1, cpu_threads=1)


ROOT = Path(__file__).resolve().parents[1]


def _check_timing(row, batch_size, windows):
    assert row["ms_per_step"] > 0
    assert math.isclose(row["images_per_s"], batch_size / (row["ms_per_step"] / 1e3), rel_tol=1e-9)
    assert len(row["windows_ms"]) == windows
    assert min(row["windows_ms"]) <= round(row["ms_per_step"], 3) <= max(row["windows_ms"])


def test_summarize_takes_the_median_window():
    stats = summarize([0.010, 0.030, 0.020], batch_size=8)
    assert stats["ms_per_step"] == pytest.approx(20.0)
    assert stats["images_per_s"] == pytest.approx(400.0)
    assert stats["spread"] == pytest.approx(1.0)
    assert paired_ratio([2.0, 6.0, 3.0], [1.0, 2.0, 2.0]) == pytest.approx(2.0)


def test_median_interval_is_the_order_statistics_the_binomial_gives():
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) is None  # 5 values cannot hold 95%: 2/32 > 0.05
    assert median_interval(list(range(6))) == (0, 5)  # 1 - 2/64 = 96.9%
    assert median_interval(list(range(1, 41))) == (14, 27)  # the textbook ranks for n = 40
    # It holds the true median at least as often as it says: 4,000 samples of 20 from a skewed distribution.
    rng = np.random.default_rng(0)
    samples = rng.lognormal(0.0, 1.0, (4000, 20))
    covered = np.mean([lo <= 1.0 <= hi for lo, hi in map(median_interval, samples)])  # the median of e^N(0,1) is 1
    assert covered >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / 4000)
    assert paired_ratio_interval([2.0] * 6, [1.0, 2.0, 4.0, 1.0, 2.0, 4.0]) == (0.5, 2.0)


def test_parse_options_validates_keys_and_types():
    cfg = parse_options(TrainBenchConfig, ["model=tiny", "batch_size=4"], "train")
    assert (cfg.model, cfg.batch_size, cfg.image_size) == ("tiny", 4, 32)
    with pytest.raises(ConfigError, match="modle.*valid keys: model"):
        parse_options(TrainBenchConfig, ["modle=tiny"], "train")
    with pytest.raises(ConfigError, match="batch_size"):
        parse_options(TrainBenchConfig, ["batch_size=many"], "train")
    with pytest.raises(ConfigError, match="key=value"):
        parse_options(TrainBenchConfig, ["tiny"], "train")


def test_train_reports_throughput_and_memory():
    result = run_train(TrainBenchConfig(**TINY))
    (row,) = result["rows"]
    _check_timing(row, 4, 2)
    assert row["peak_rss_mb"] > 10 and row["peak_gpu_allocated_mb"] is None
    assert result["environment"]["cpu_threads"] == 1
    json.dumps(result)  # JSON-ready as returned


def test_train_compiles_the_model_to_a_static_graph_when_asked(monkeypatch):
    import paddle

    compiled = []
    real = paddle.jit.to_static
    monkeypatch.setattr(paddle.jit, "to_static", lambda model, **kw: compiled.append(kw) or real(model, **kw))
    result = run_train(TrainBenchConfig(**{**TINY, "to_static": True}))
    assert compiled == [{"full_graph": True}] and result["rows"][0]["to_static"] is True
    _check_timing(result["rows"][0], 4, 2)
    assert run_train(TrainBenchConfig(**TINY))["rows"][0]["to_static"] is False and len(compiled) == 1


def test_train_on_cpu_notes_that_amp_is_inert():
    result = run_train(TrainBenchConfig(**{**TINY, "precision": "amp_o1"}))
    assert result["rows"][0]["amp_active"] is False
    assert any("inert" in note for note in result["notes"])
    with pytest.raises(ConfigError, match="precision"):
        run_train(TrainBenchConfig(**{**TINY, "precision": "fp8"}))


def test_threads_interleaves_each_count():
    result = run_threads(ThreadsBenchConfig(**{**TINY, "threads": [1, 2]}))
    assert [r["cpu_threads"] for r in result["rows"]] == [1, 2]
    for row in result["rows"]:
        _check_timing(row, 4, 2)
    best = min(result["rows"], key=lambda r: r["ms_per_step"])
    assert result["summary"]["best_cpu_threads"] == best["cpu_threads"]
    assert result["summary"]["speedup_best_vs_worst"] >= 1.0


def test_overhead_runs_every_arm_and_reports_ratios():
    result = run_overhead(OverheadBenchConfig(**TINY))
    assert [r["arm"] for r in result["rows"]] == list(ARMS)
    for row in result["rows"]:
        _check_timing(row, 4, 2)
    summary = result["summary"]
    by_arm = {r["arm"]: r for r in result["rows"]}
    assert set(summary) == {"trainer_vs_hand", "trainer_vs_bare", "trainer_vs_model_fit",
                            "trainer_overhead_ms_per_step"}
    assert all(v > 0 for k, v in summary.items() if k.startswith("trainer_vs"))
    # The paired ratio lies between the extreme window ratios.
    ratios = [h / t for h, t in zip(by_arm["hand"]["windows_ms"], by_arm["trainer"]["windows_ms"], strict=True)]
    assert min(ratios) - 1e-2 <= summary["trainer_vs_hand"] <= max(ratios) + 1e-2
    assert [g["goal"] for g in result["goals"]] == ["trainer_vs_hand >= 0.98", "trainer_vs_model_fit >= 1.0"]
    assert all(g["interval"] is None for g in result["goals"])  # two windows: too few for a 95% interval
    assert all(g["met"] == (g["measured"] >= float(g["goal"].split(">= ")[1])) for g in result["goals"])
    assert any(note.startswith("hand:") for note in result["notes"])
    parts = result["trainer_parts_us"]
    # The Trainer caches the parameter list, so its walk is reported as a once-per-fit cost, not per step.
    assert any(k.startswith("module.parameters()") and "once per fit" in k for k in parts)
    assert any(k.startswith("gradient norm") for k in parts)  # the Precision.step part that calls Paddle's clip
    assert all(v > 0 for v in parts.values())
    assert "Trainer step part" in to_markdown(result)


def test_overhead_rejects_unknown_arm():
    with pytest.raises(ConfigError, match="arms"):
        run_overhead(OverheadBenchConfig(**{**TINY, "arms": ["trainer", "lightning"]}))


def test_overhead_without_trainer_arm_skips_attribution():
    result = run_overhead(OverheadBenchConfig(**{**TINY, "arms": ["hand", "bare"]}))
    assert result["summary"] == {} and result["trainer_parts_us"] == {} and result["goals"] == []


def test_data_reports_bare_loader_and_trainer_wait():
    cfg = DataBenchConfig(num_images=24, source_size=16, image_size=8, batch_size=8, workers=[0, 1], epochs=1,
                          model="tiny", train_batches=2, cpu_threads=1)
    result = run_data(cfg)
    bare, *loaders = result["rows"]
    assert bare["num_workers"] is None and bare["images_per_s"] > 0
    assert [r["num_workers"] for r in loaders] == [0, 1]
    for row in loaders:
        assert row["vs_bare"] == pytest.approx(row["images_per_s"] / bare["images_per_s"])
        assert row["first_batch_s"] >= 0
        assert 0.0 <= row["data_time_share"] <= 1.0 and row["train_images_per_s"] > 0
    assert result["goals"][0]["goal"] == "num_workers=0 >= 0.9 x bare"
    assert cfg.root is None  # the synthetic folder was temporary


def test_inference_batch_table_and_pipeline():
    cfg = InferenceBenchConfig(model="tiny", image_size=16, num_classes=10, batch_sizes=[1, 4], images_per_window=4,
                               windows=2, predict_images=8, predict_batch_size=4, predict_workers=0,
                               predict_windows=1, cpu_threads=1, precisions=["fp32"], runtimes_threads=[])
    result = run_inference(cfg)
    assert [r["batch_size"] for r in result["rows"]] == [1, 4]
    for row in result["rows"]:
        for arm in ("dygraph", "predictor_fp32"):
            assert row[f"{arm}_images_per_s"] == pytest.approx(row["batch_size"] / row[f"{arm}_latency_ms"] * 1e3)
        assert row["predictor_fp32_vs_dygraph"] > 0
        assert row["predictor_fp32_rel_error"] < TOLERANCE["fp32"]  # the same model
    with_onnx = importlib.util.find_spec("paddle2onnx") and importlib.util.find_spec("onnxruntime")
    runtimes = ["paddle fp32", "onnxruntime fp32"] if with_onnx else ["paddle fp32"]
    assert [p["runtime"] for p in result["pipeline"]] == runtimes
    for pipeline in result["pipeline"]:
        assert pipeline["images"] == 8 and pipeline["num_workers"] == 0
        assert pipeline["ratio"] == pytest.approx(pipeline["predict_files_images_per_s"]
                                                  / pipeline["bare_predictor_images_per_s"])
    assert result["runtimes"] == []  # runtimes_threads=[] skips the runtime comparison
    assert [g["goal"] for g in result["goals"]] == [
        "predictor (fp32) >= 4 x dygraph (fp32) at every batch size",
        *(f"predict_files >= 0.9 x bare predictor ({runtime})" for runtime in runtimes)]


@pytest.mark.slow  # exports and times both runtimes (9 s); the other bench commands stay in the default suite
def test_inference_compares_paddle_with_onnxruntime_per_thread_count_and_batch():
    pytest.importorskip("paddle2onnx", reason="the runtime comparison exports ONNX (the onnx extra)")
    pytest.importorskip("onnxruntime", reason="the runtime comparison runs onnxruntime (the onnx extra)")
    cfg = InferenceBenchConfig(model="tiny", image_size=16, num_classes=10, batch_sizes=[2], images_per_window=2,
                               windows=1, predict_images=0, cpu_threads=1, precisions=["fp32"],
                               runtimes_model="tiny", runtimes_threads=[1, 2], runtimes_batch_sizes=[1, 3],
                               runtimes_windows=2, warmup=0, runtimes_programdesc=True)
    result = run_inference(cfg)
    rows = result["runtimes"]
    assert [(r["batch_size"], r["threads"]) for r in rows] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    for row in rows:
        assert len(row["paddle_windows_s"]) == len(row["onnx_windows_s"]) == 2
        ratios = sorted(o / p for o, p in zip(row["onnx_windows_s"], row["paddle_windows_s"], strict=True))
        assert row["paddle_vs_onnx"] == pytest.approx(sum(ratios) / 2)  # the median of two windows
        assert len(row["programdesc_windows_s"]) == 2 and row["programdesc_vs_onnx"] > 0
    goals = [g["goal"] for g in result["goals"]]
    assert "Paddle Inference fp32 >= 1.0 x onnxruntime fp32 (tiny, batch 3, 2 threads)" in goals
    assert "### bench inference" in to_markdown(result) and "paddle_vs_onnx" in to_markdown(result)


def test_decode_compares_the_pool_with_a_dataloader_doing_the_same_work():
    result = run_decode(DecodeBenchConfig(images=10, image_size=16, batch_size=4, num_workers=1, windows=2, warmup=0))
    rows = {row["arm"]: row for row in result["rows"]}
    assert list(rows) == ["pool", "dataloader", "main"]
    assert [rows[arm]["num_workers"] for arm in rows] == [1, 1, 0]
    for row in rows.values():
        assert row["images"] == 10 and len(row["windows_s"]) == 2
        assert row["images_per_s"] == pytest.approx(10 / row["seconds_per_pass"])
        assert 0 < row["first_batch_s"] < row["seconds_per_pass"] and row["rest_images_per_s"] > 0
    assert rows["main"]["worker_cpu_s"] == 0 and rows["pool"]["worker_cpu_s"] > 0
    assert rows["dataloader"]["worker_cpu_s"] > 0
    assert set(result["summary"]) == {"dataloader_vs_pool", "pool_vs_main", "dataloader_vs_main"}
    [goal] = result["goals"]
    assert goal["met"] == (result["summary"]["dataloader_vs_pool"] < 0.95)


def test_decode_waits_for_its_own_workers_only(monkeypatch):
    """A pass joins the pool's workers to count their CPU, not other children of the process (a test's forking
    server: joining it cost 30 s a pass in CI)."""
    stop = multiprocessing.Event()
    bystander = multiprocessing.Process(target=stop.wait, daemon=True)
    bystander.start()
    joined = []
    join = multiprocessing.Process.join

    def spying_join(process, timeout=None):
        joined.append(process.pid)
        return join(process, timeout)

    monkeypatch.setattr(multiprocessing.Process, "join", spying_join)
    try:
        result = run_decode(DecodeBenchConfig(images=6, image_size=16, batch_size=2, num_workers=1, windows=1,
                                              warmup=0, arms=["pool"]))
        assert bystander.pid not in joined and bystander.is_alive()
        assert result["rows"][0]["worker_cpu_s"] > 0  # the pool's own worker, reaped before the count
    finally:
        stop.set()
        monkeypatch.undo()
        bystander.join(10)


def test_decode_dataloader_arm_gives_the_pools_batches_bad_files_included(tmp_path):
    """The comparison is fair only if both arms deliver the same batches: same order, same failures."""
    from PIL import Image

    from comparisons.decode import _preprocessing, dataloader_batches
    from paddletrain.deploy.decoding import decoded_batches

    rng = np.random.default_rng(0)
    paths = []
    for i in range(7):
        path = tmp_path / f"{i}.jpg"
        if i in (2, 4, 5):  # a batch with one bad file, and a batch of bad files only
            path.write_bytes(b"not a jpeg")
        else:
            Image.fromarray(rng.integers(0, 256, (20, 18 + i, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    chunks = [paths[0:3], paths[3:4], paths[4:6], paths[6:7]]
    preprocessing = _preprocessing(16)

    def collect(pipeline, workers):
        return [(ok, None if x is None else x.copy(), [p for p, _ in failed])
                for ok, x, failed in pipeline(chunks, preprocessing, workers, (3, 16, 16))]

    pool, loader = collect(decoded_batches, 1), collect(dataloader_batches, 1)
    assert [(ok, failed) for ok, _, failed in loader] == [(ok, failed) for ok, _, failed in pool]
    assert [failed for _, _, failed in pool] == [[paths[2]], [], [paths[4], paths[5]], []]
    for (_, a, _), (_, b, _) in zip(pool, loader, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(cpu_bf16_support() != "fast",
                    reason="needs a CPU with AVX512-BF16 or AMX: only there is bf16 compared by default")
def test_inference_compares_a_bf16_predictor_by_default_where_the_cpu_runs_it():
    cfg = InferenceBenchConfig(model="tiny", image_size=16, num_classes=10, batch_sizes=[2], images_per_window=2,
                               windows=1, predict_images=0, cpu_threads=1, runtimes_threads=[])
    result = run_inference(cfg)
    row = result["rows"][0]
    assert row["predictor_bf16_vs_dygraph"] > 0 and row["predictor_fp32_rel_error"] < TOLERANCE["fp32"]
    assert 1e-4 < row["predictor_bf16_rel_error"] < TOLERANCE["bf16"]
    assert len(result["goals"]) == 2  # one per precision, no pipeline


def test_inference_refuses_a_precision_this_machine_cannot_run():
    with pytest.raises(UserError, match="use_mkldnn=false"):
        run_inference(InferenceBenchConfig(model="tiny", image_size=16, num_classes=10, precisions=["bf16"],
                                           use_mkldnn=False, predict_images=0))


def test_markdown_table_skips_per_window_lists():
    text = table([{"arm": "hand", "ms_per_step": 12.345, "windows_ms": [1, 2]}, {"arm": "x", "extra": None}])
    assert text.splitlines()[0] == "| arm | ms_per_step | extra |"
    assert "| hand | 12.3 | - |" in text and "windows_ms" not in text


def test_cli_writes_json_and_markdown(tmp_path):
    out = tmp_path / "r" / "train.json"
    proc = run_module("paddletrain.bench", ["train", "model=tiny", "batch_size=2", "image_size=8", "windows=2",
                                            "steps=1", "warmup=0", "cpu_threads=1", f"out={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["benchmark"] == "train" and result["config"]["batch_size"] == 2
    assert out.with_suffix(".md").read_text() == to_markdown(result)
    assert "| model | batch_size |" in proc.stdout


def test_cli_bad_option_is_one_clear_line(tmp_path):
    proc = run_module("paddletrain.bench", ["data", "epochz=3"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "epochz" in proc.stderr and "Traceback" not in proc.stderr
    # The maintainers' suite runs from a checkout: the repository on the path.
    proc = run_module("comparisons", ["overhead", "stepz=3"], cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert "stepz" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_module("paddletrain.bench", ["speed"], cwd=tmp_path)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_precision_judges_each_predictor_and_the_mistakes_with_the_parity_measure(tmp_path):
    from PIL import Image

    from paddletrain.bench.precision_cost import PrecisionBenchConfig, run_precision

    rng = np.random.default_rng(0)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "notes.txt").write_text("not an image")
    result = run_precision(PrecisionBenchConfig(model="resnet20", num_classes=10, image_size=32,
                                                images=str(tmp_path), batch_size=4))
    rows = {row["logits"]: row for row in result["rows"]}
    assert rows["predictor fp32"]["passes"] and rows["predictor fp32"]["relative error"] < 1e-4
    assert rows["predictor fp32"]["tolerance"] == TOLERANCE["fp32"]
    if cpu_bf16_support() != "none":
        assert rows["predictor bf16"]["passes"] and rows["predictor bf16"]["relative error"] > 1e-4
    mistakes = [row for name, row in rows.items() if name.startswith("mistake")]
    assert len(mistakes) == 3 and not any(row["passes"] for row in mistakes)
    assert all(row["tolerance"] == max(TOLERANCE.values()) for row in mistakes)
    assert "6 images" in result["notes"][0]


def test_index_reports_parse_memory_workers_and_the_scan_cache():
    from paddletrain.bench.million_files import IndexBenchConfig, run_index

    result = run_index(IndexBenchConfig(lines=3000, classes=10, repeats=1, workers=2, batch_size=256,
                                        folder_files=300, folder_classes=3))
    measures = [row["measure"] for row in result["rows"]]
    assert measures == ["parse 3000 lines, check_files=False", "existence checks of 300 files, per million lines",
                        "scan, data.scan_cache=false", "first start: scan + write the cache",
                        "second start: from the cache"]
    assert all(row["min_s"] <= row["median_s"] for row in result["rows"])
    assert result["rows"][-1]["same_index"] is True and result["rows"][-1]["vs_scan"] > 0
    memory = result["summary"]
    assert memory["tuple_list_mb"] > memory["index_mb"] > 0  # 3000 tuples cost more than the arrays
    arms = [row["samples held as"] for row in result["pipeline"]]
    assert arms == ["SampleIndex"] * 2 + ["list of (path, label)"] * 2  # one row per worker
    assert all(row["uss_start_mb"] > 0 for row in result["pipeline"])
    held = [row.get("arrays_held_alone_mb") for row in result["pipeline"]]
    assert held[2:] == [None, None]  # the list is no array: only the index's pages are counted
    assert all(h is None or 0 <= h < memory["index_mb"] for h in held[:2])
    assert [g["goal"] for g in result["goals"]] == ["each worker's USS grows < 10% of the index over an epoch"]
    json.dumps(result)


@pytest.mark.slow  # 24 s; int8 prediction is tested in tests/test_deploy_quantize.py
def test_inference_times_an_int8_predictor_against_the_fp32_one_when_asked():
    cfg = InferenceBenchConfig(model="tiny", image_size=16, num_classes=10, batch_sizes=[8], images_per_window=8,
                               windows=2, predict_images=0, cpu_threads=1, precisions=["fp32", "int8"])
    result = run_inference(cfg)
    [row] = result["rows"]
    assert row["predictor_int8_vs_fp32"] > 0 and row["predictor_int8_images_per_s"] > 0
    [goal] = [g for g in result["goals"] if "int8" in g["goal"] and "predictor (fp32)" in g["goal"]]
    assert goal["measured"] == row["predictor_int8_vs_fp32"] and goal["met"] == (goal["measured"] >= 2.0)
