"""``data=shards``: the same samples as the image folder they were packed from, trained on from local files or a
real HTTP server, cached, resumed bitwise mid-epoch, and refusing what is wrong (paddletrain.data.shards.dataset)."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from paddletrain.checkpoint import find_latest, load_checkpoint
from paddletrain.data import build_datasets, build_loader
from paddletrain.data.errors import DatasetError, SourceUnavailableError
from paddletrain.data.shards.index import ShardIndex
from paddletrain.data.shards.pack import pack
from paddletrain.errors import ConfigError
from tests.conftest import compose_fit, datasets_of, run_module, write_image_folder, write_multilabel_squares
from tests.http_shards import FaultyServer

# 16 training images in 4 shards of 4, 8 validation images in 2.
RUN = ["data.image_size=12", "data.batch_size=4", "data.num_workers=0", "data.shuffle_buffer=6", "trainer.max_epochs=3",
       "callbacks.progress_bar.enabled=false", "trainer.cpu_threads=1", "sched.warmup_epochs=0"]
STEPS_PER_EPOCH = 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    write_image_folder(root)
    out = root / "shards"
    pack(root, out, shard_size_mb=10 / 1024, seed=0)  # one tar record of 10 KiB: four 12x12 PNGs and labels
    assert len(list(out.glob("train-*.tar"))) == 4 and len(list(out.glob("val-*.tar"))) == 2
    return out


def urls(base: str) -> list[str]:
    return [f"data.urls='{base}/train-{{000000..000003}}.tar'", f"data.val_urls='{base}/val-{{000000..000001}}.tar'"]


def fit(run_dir: Path, *extra: str, ok: bool = True) -> subprocess.CompletedProcess:
    result = run_module("paddletrain.fit", ["data=shards", *RUN, f"hydra.run.dir={run_dir}", *extra],
                        cwd=run_dir.parent)
    if ok:
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def model_state(run_dir: Path) -> dict[str, np.ndarray]:
    state = load_checkpoint(find_latest(run_dir / "checkpoints")).state
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in state["model"].items()}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_shards_hold_the_samples_of_the_folder_they_were_packed_from(shards, tmp_path):
    root = shards.parent
    cfg = compose_fit(["data=shards", *urls(str(shards)), f"data.cache_dir={tmp_path}"])
    packed = datasets_of(cfg)
    folder = datasets_of(compose_fit(["data=imagefolder", f"data.root={root}"]))
    assert packed.classes == folder.classes == ["a", "b"]
    by_file = {Path(folder.train.describe(i)).relative_to(root / "train").with_suffix("").as_posix(): i
               for i in range(len(folder.train))}
    assert len(packed.train) == len(by_file) == 16
    for i in range(len(packed.train)):
        image, label = packed.train[i]
        key = packed.train.describe(i).split("#", 1)[1]
        expected_image, expected_label = folder.train[by_file[key]]
        assert label == expected_label
        np.testing.assert_array_equal(np.asarray(image), np.asarray(expected_image))
    # The builder's own keys are handed over, not read from the node: without them, one line says how.
    with pytest.raises(ConfigError, match=r"^data\.urls is an option of data\.name=shards's builder: pass .*"
                                          r"options=paddletrain\.config\.factory_options\(cfg\)\['data'\]"):
        build_datasets(cfg.data)


def test_multilabel_shards_give_multi_hot_rows(tmp_path):
    root = write_multilabel_squares(tmp_path / "squares")
    pack(root / "train_list.txt", tmp_path / "s", multilabel=True, prefix="train")
    pack(root / "val_list.txt", tmp_path / "s", multilabel=True, prefix="val")
    shards = [f"data.urls={tmp_path}/s/train-000000.tar", f"data.val_urls={tmp_path}/s/val-000000.tar",
              f"data.cache_dir={tmp_path}/c"]
    splits = datasets_of(compose_fit(["data=shards", *shards, "data.multilabel=true"]))
    _, label = splits.train[0]
    assert splits.train.multilabel and label.dtype == np.float32 and label.shape == (4,) and label.sum() == 2
    with pytest.raises(ConfigError, match="index is multi-label, but data.multilabel=false; set data.multilabel=true"):
        datasets_of(compose_fit(["data=shards", *shards]))
    result = fit(tmp_path / "run", *shards, "data.multilabel=true", "trainer.max_epochs=1", "data.image_size=16")
    assert "val/mAP" in result.stdout + result.stderr


def test_training_on_local_shards_resumes_mid_epoch_bitwise(shards, tmp_path):
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    fit(straight, *urls(str(shards)), f"data.cache_dir={tmp_path}/c", "data.num_workers=2")
    fit(broken, *urls(str(shards)), f"data.cache_dir={tmp_path}/c", "data.num_workers=2",
        f"trainer.max_steps={STEPS_PER_EPOCH + 2}")
    state = load_checkpoint(find_latest(broken / "checkpoints")).state
    assert state["progress"]["batch_in_epoch"] == 2
    fit(broken, *urls(str(shards)), f"data.cache_dir={tmp_path}/c", "data.num_workers=2", "trainer.resume=auto")
    assert_same_weights(model_state(straight), model_state(broken))


def test_training_over_http_is_cached_resumes_bitwise_and_equals_local_files(shards, tmp_path):
    local = tmp_path / "local"
    fit(local, *urls(str(shards)), f"data.cache_dir={tmp_path}/unused")
    with FaultyServer(shards) as server:
        server.drop_after["train-000002.tar"] = 3000  # a connection dropped mid-shard, once
        server.drops_left["train-000002.tar"] = 1
        run = tmp_path / "http"
        fit(run, *urls(server.url), f"data.cache_dir={tmp_path}/cache", f"trainer.max_steps={STEPS_PER_EPOCH + 1}")
        fit(run, *urls(server.url), f"data.cache_dir={tmp_path}/cache", "trainer.resume=auto")
        # Each shard went over the wire once (the dropped one twice, the second read continuing the first):
        # the later epochs and the resumed run read the cache.
        fetched = {name: n for name, n in server.requests.items() if name.endswith(".tar")}
        assert fetched == {"train-000000.tar": 1, "train-000001.tar": 1, "train-000002.tar": 2,
                           "train-000003.tar": 1, "val-000000.tar": 1, "val-000001.tar": 1}
        assert server.starts["train-000002.tar"] == [0, 3000]
    assert_same_weights(model_state(local), model_state(run))


def test_a_shard_that_does_not_match_its_index_is_refused_or_skipped_by_the_policy(shards, tmp_path):
    index = ShardIndex.read(shards / "train.index.json")
    with FaultyServer(shards) as server:
        server.corrupt["train-000001.tar"] = 700
        failed = fit(tmp_path / "fail", *urls(server.url), f"data.cache_dir={tmp_path}/c1", ok=False)
        assert failed.returncode == 2, failed.stderr[-2000:]
        output = failed.stdout + failed.stderr
        assert f"{server.url}/train-000001.tar has sha256" in output
        assert f"its index says {index.shards[1].sha256}" in output and "Traceback" not in output
        skipped = fit(tmp_path / "skip", *urls(server.url), f"data.cache_dir={tmp_path}/c2",
                      "data.bad_sample_policy=skip", "data.max_bad_fraction=0.5", "trainer.max_epochs=1")
        assert "skipping unreadable sample" in skipped.stdout + skipped.stderr
    assert not list((tmp_path / "c1").glob("*.tar")) or all(
        p.read_bytes() != b"" for p in (tmp_path / "c1").glob("*.tar"))


def test_a_server_that_stays_away_stops_the_run_in_one_line_naming_the_url(shards, tmp_path):
    with FaultyServer(shards) as server:
        server.fail_status, server.failing = 503, {"train-000000.tar", "train-000001.tar", "train-000002.tar",
                                                  "train-000003.tar"}
        result = fit(tmp_path / "run", *urls(server.url), f"data.cache_dir={tmp_path}/c", "data.retries=1",
                     "data.deadline=5", "data.bad_sample_policy=skip", ok=False)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-2000:]
    lines = [line for line in output.splitlines() if "cannot read" in line]
    assert lines and f"{server.url}/train-00000" in lines[0] and "stopped at byte 0 after 2 attempts" in lines[0]
    assert "Traceback" not in output


def test_the_loader_raises_a_source_failure_whatever_the_policy(shards, tmp_path):
    with FaultyServer(shards) as server:
        cfg = compose_fit(["data=shards", *urls(server.url), f"data.cache_dir={tmp_path}", "data.retries=0",
                           "data.bad_sample_policy=skip", "data.max_bad_fraction=1.0", "data.batch_size=4"])
        splits = datasets_of(cfg)
        server.fail_status = 500
        loader = build_loader(splits.train, cfg.data, train=True, seed=0)
        loader.batch_sampler.set_epoch(0)
        with pytest.raises(SourceUnavailableError, match="HTTP 500"):
            next(iter(loader))


@pytest.mark.parametrize(("overrides", "needle"), [
    ([], "data=shards reads data.urls"),
    (["data.urls='/nowhere/train-{000000..000001}.tar'", "data.val_urls=/nowhere/val.tar"], "nowhere"),
    (["data.urls=a.tar", "data.val_urls=b.tar", "data.shuffle_buffer=0"], "data.shuffle_buffer=0 must be"),
    (["data.urls=a.tar", "data.val_urls=b.tar", "data.cache_max_gb=-1"], "data.cache_max_gb"),
    (["data.urls=a.tar", "data.val_urls=b.tar", "data.fetch_ahead=-1"], "data.fetch_ahead=-1 must be"),
    (["data.urls=5", "data.val_urls=b.tar"], "data.urls=5 must be a path or URL pattern"),
    (["data.urls=[a.tar,7]", "data.val_urls=b.tar"], "must be a path or URL pattern, or a list of them"),
    (["data.urls=a.tar", "data.val_urls=b.tar", "data.index=5"], "data.index=5 must be a path"),
])
def test_mistakes_are_named(overrides, needle, tmp_path):
    from paddletrain.errors import UserError

    cfg = compose_fit(["data=shards", f"data.cache_dir={tmp_path}", *overrides])
    with pytest.raises((UserError, DatasetError), match=needle):
        datasets_of(cfg)


HYMENOPTERA = Path("/work/shared/data/hymenoptera_data")


@pytest.mark.skipif(not HYMENOPTERA.is_dir(), reason=f"the ants/bees photos are not at {HYMENOPTERA}")
def test_the_ants_and_bees_photos_pack_and_stream_as_the_folder_reads_them(tmp_path):
    result = pack(HYMENOPTERA, tmp_path / "s", shard_size_mb=8)
    train, val = (ShardIndex.read(split.index_path) for split in result.splits)
    assert (train.num_samples, val.num_samples) == (244, 153)  # the .gif left out, as data=imagefolder does
    assert len(train.shards) > 2
    folder = datasets_of(compose_fit(["data=imagefolder", f"data.root={HYMENOPTERA}"]))
    files = {Path(folder.val.describe(i)).relative_to(HYMENOPTERA / "val"): i for i in range(len(folder.val))}
    last = f"{len(train.shards) - 1:06d}"
    with FaultyServer(tmp_path / "s") as server:
        cfg = compose_fit(["data=shards", f"data.urls='{server.url}/train-{{000000..{last}}}.tar'",
                           f"data.val_urls='{server.url}/val-{{000000..{len(val.shards) - 1:06d}}}.tar'",
                           f"data.cache_dir={tmp_path}/c"])
        shards = datasets_of(cfg)
        assert shards.classes == folder.classes == ["ants", "bees"]
        for i in range(len(shards.val)):
            key = shards.val.describe(i).split("#", 1)[1]
            match = [f for f in files if f.with_suffix("").as_posix().replace(".", "_") == key]
            assert len(match) == 1, key
            image, label = shards.val[i]
            expected, expected_label = folder.val[files[match[0]]]
            assert label == expected_label and image.size == expected.size
            if i % 25 == 0:  # decoding every full-size photo twice would take the suite half a minute
                np.testing.assert_array_equal(np.asarray(image), np.asarray(expected))


@pytest.mark.slow  # about a minute: two nodes and a reference run; CI's slow pass runs it
@pytest.mark.timeout(400)
def test_two_nodes_read_one_http_server_and_train_like_two_devices_on_local_shards(shards, tmp_path):
    from tests.reliability.procs import Run, free_port

    reference = tmp_path / "reference"
    fit(reference, *urls(str(shards)), f"data.cache_dir={tmp_path}/unused", "trainer.devices=2")
    with FaultyServer(shards) as server:
        master = f"trainer.master=127.0.0.1:{free_port()}"
        # Each node its own cache, as two machines would have.
        nodes = [Run(tmp_path, "data=shards", *RUN, *urls(server.url), f"data.cache_dir={tmp_path}/cache{node}",
                     "trainer.num_nodes=2", f"trainer.node_rank={node}", master, name=f"node{node}",
                     run_dir=tmp_path / "nodes", tiny=False) for node in (0, 1)]
        try:
            codes = [node.wait(300) for node in nodes]
        finally:
            for node in nodes:
                node.kill()
        assert codes == [0, 0], "\n".join(node.output[-2000:] for node in nodes)
        fetched = {name: n for name, n in server.requests.items() if name.endswith(".tar")}
    assert fetched == {name: 2 for name in fetched} and len(fetched) == 6  # every shard once per node
    assert_same_weights(model_state(reference), model_state(tmp_path / "nodes"))


def test_a_run_stopped_mid_epoch_on_two_ranks_continues_on_one(shards, tmp_path):
    """The global batch kept (4 a rank on two, 8 on one): the epoch's rest (8 of its 16 samples) is one step."""
    run = tmp_path / "run"
    fit(run, *urls(str(shards)), f"data.cache_dir={tmp_path}/c", "trainer.devices=2", "trainer.max_steps=3")
    state = load_checkpoint(find_latest(run / "checkpoints")).state
    assert (state["progress"]["epoch"], state["progress"]["batch_in_epoch"]) == (1, 1)
    assert state["sampler"]["consumed"] == 8
    resumed = fit(run, *urls(str(shards)), f"data.cache_dir={tmp_path}/c", "data.batch_size=8", "trainer.resume=auto")
    assert "at epoch 1, batch 1, global step 3" in resumed.stdout + resumed.stderr
    final = load_checkpoint(find_latest(run / "checkpoints")).state
    assert final["progress"]["global_step"] == 3 + 1 + 2  # the rest of epoch 2, then epoch 3's two steps


def test_a_run_over_http_killed_mid_epoch_continues_bitwise(shards, tmp_path):
    import os
    import signal
    import sys
    import time

    straight = tmp_path / "straight"
    fit(straight, *urls(str(shards)), f"data.cache_dir={tmp_path}/unused")
    run = tmp_path / "killed"
    with FaultyServer(shards) as server:
        args = ["data=shards", *RUN, *urls(server.url), f"data.cache_dir={tmp_path}/cache", f"hydra.run.dir={run}",
                "callbacks.checkpoint.every_n_steps=1", "callbacks.checkpoint.keep_last=20"]
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *args], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not (
                (run / "checkpoints").is_dir() and find_latest(run / "checkpoints")):
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the whole run, loader workers included, as a lost machine would
        proc.wait(30)
        assert proc.returncode == -signal.SIGKILL and not (run / "summary.json").exists()
        killed_at = load_checkpoint(find_latest(run / "checkpoints")).state["progress"]["global_step"]
        assert 0 < killed_at < 3 * STEPS_PER_EPOCH
        fit(run, *urls(server.url), f"data.cache_dir={tmp_path}/cache", "trainer.resume=auto")
    assert_same_weights(model_state(straight), model_state(run))


def test_class_balanced_sampling_draws_within_the_shards_windows(shards, tmp_path):
    from paddletrain.data.sampling.balance import class_balanced_weights

    cfg = compose_fit(["data=shards", *urls(str(shards)), f"data.cache_dir={tmp_path}", "data.sampler=class_balanced",
                       "data.batch_size=4", "data.num_workers=0", "data.shuffle_buffer=6", "data.image_size=12"])
    train = datasets_of(cfg).train
    loader = build_loader(train, cfg.data, train=True, seed=3)
    loader.batch_sampler.set_epoch(1)
    weights = class_balanced_weights(train.targets)
    expected = train.epoch_order(3, 1, weights=weights / weights.sum())
    drawn = [key.index for keys in loader.batch_sampler for key in keys]
    assert drawn == expected[:len(drawn)].tolist() and len(drawn) == 16
    assert sum(1 for _ in loader) == 4


@pytest.mark.slow  # about a minute: 244 full-size photos decoded each epoch of three runs; CI's slow pass runs it
@pytest.mark.skipif(not HYMENOPTERA.is_dir(), reason=f"the ants/bees photos are not at {HYMENOPTERA}")
def test_training_on_the_photos_over_http_resumes_mid_epoch_bitwise(tmp_path):
    result = pack(HYMENOPTERA, tmp_path / "s", shard_size_mb=8)
    train, val = (len(split.shards) for split in result.splits)
    photos = ["data.image_size=32", "data.batch_size=16", "data.num_workers=2", "data.shuffle_buffer=100",
              "trainer.max_epochs=2", "callbacks.progress_bar.enabled=false", "trainer.cpu_threads=1",
              "sched.warmup_epochs=0"]
    with FaultyServer(tmp_path / "s") as server:
        shards = [f"data.urls='{server.url}/train-{{000000..{train - 1:06d}}}.tar'",
                  f"data.val_urls='{server.url}/val-{{000000..{val - 1:06d}}}.tar'", f"data.cache_dir={tmp_path}/c"]
        runs = {}
        for name, extra in (("straight", []), ("stopped", ["trainer.max_steps=20"])):
            runs[name] = tmp_path / name
            done = run_module("paddletrain.fit", ["data=shards", *photos, *shards, f"hydra.run.dir={runs[name]}",
                                                  *extra], cwd=tmp_path, timeout=600)
            assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert load_checkpoint(find_latest(runs["stopped"] / "checkpoints")).state["progress"]["batch_in_epoch"] == 5
        done = run_module("paddletrain.fit", ["data=shards", *photos, *shards, f"hydra.run.dir={runs['stopped']}",
                                              "trainer.resume=auto"], cwd=tmp_path, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert_same_weights(model_state(runs["straight"]), model_state(runs["stopped"]))


def test_a_server_that_drops_every_read_half_way_ends_the_run_in_bounded_time_saying_so(shards, tmp_path):
    """The fault as a user met it: every response cut half-way, ranges included. Each retry is logged, the run
    ends in one line naming the URL and the byte reached, with the command that continues, and no sample asks
    the server again for a shard whose fetch gave up."""
    with FaultyServer(shards) as server:
        server.drop_half = ".tar"  # the index is read; every shard is cut
        started = time.monotonic()
        result = fit(tmp_path / "run", *urls(server.url), f"data.cache_dir={tmp_path}/c", "data.retries=2",
                     "data.num_workers=1", ok=False)
        seconds = time.monotonic() - started
        requests = dict(server.requests)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert seconds < 90, seconds
    assert re.search(r"shard server: reading http://127\.0\.0\.1:\d+/train-00000\d\.tar failed at byte \d+ of \d+ "
                     r"\(the connection closed before the end\); attempt 2 of 3", output), output[-3000:]
    last = [line for line in output.splitlines() if "cannot read" in line][-1]
    assert re.search(r"cannot read http://127\.0\.0\.1:\d+/train-00000\d\.tar: stopped at byte \d+ of \d+ after 3 "
                     r"attempts", last), last
    assert "continue with: python -m paddletrain.fit" in last and "trainer.resume=auto" in last
    assert "Traceback" not in output
    # Three attempts a shard at most, whichever process asked (the reader or the fetch-ahead).
    assert requests and max(requests.values()) <= 3, requests


def test_a_run_its_server_stopped_saves_what_it_trained_and_its_printed_command_finishes_it_exactly(shards, tmp_path):
    """Nothing trained is lost to a server that stays away: the steps are saved as a stop signal saves them, and
    the printed command, run once the server is back, ends on the weights of an undisturbed run."""
    import shlex

    straight = tmp_path / "straight"
    fit(straight, *urls(str(shards)), f"data.cache_dir={tmp_path}/unused")
    run = tmp_path / "stopped"
    with FaultyServer(shards) as server:
        # A shard the epoch reads after its first steps fails; fetched when first read (no fetch-ahead).
        server.fail_status, server.failing = 503, {"train-000001.tar"}
        stopped = fit(run, *urls(server.url), f"data.cache_dir={tmp_path}/cache", "data.retries=1",
                      "data.fetch_ahead=0", ok=False)
        output = stopped.stdout + stopped.stderr
        assert stopped.returncode == 2, output[-3000:]
        last = output.strip().splitlines()[-1]
        assert "cannot read" in last and "train-000001.tar" in last and "Traceback" not in output
        saved = re.search(r"the steps trained are saved in (\S+);", last).group(1)
        saved_step = load_checkpoint(saved).state["progress"]["global_step"]
        assert 0 < saved_step < 3 * STEPS_PER_EPOCH
        command = shlex.split(last.split("continue with: ", 1)[1])
        assert command[:3] == ["python", "-m", "paddletrain.fit"] and "trainer.resume=auto" in command
        server.fail_status = 0  # the server is back
        continued = run_module("paddletrain.fit", command[3:], cwd=tmp_path)
        assert continued.returncode == 0, (continued.stdout + continued.stderr)[-3000:]
        assert f"Resumed from {saved}" in continued.stdout + continued.stderr
    assert_same_weights(model_state(straight), model_state(run))
