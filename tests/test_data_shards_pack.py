"""``python -m paddletrain.data pack``: WebDataset-layout shards with an index, read by webdataset and written by
it (paddletrain.data.shards.pack)."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddletrain.data.shards.index import ShardIndex
from paddletrain.data.shards.layout import scan_shard
from paddletrain.data.shards.pack import pack, stratified_order
from paddletrain.errors import ExitCode, UserError
from tests.conftest import data_command, write_multilabel_squares

CLASSES = ("ants", "bees", "cats")


def write_folder(root: Path, per_class=(12, 6, 9), size=10) -> Path:
    """A root with train/<class>/<image> (per_class images each, PNG and JPEG) and val/ (2 a class)."""
    rng = np.random.RandomState(0)
    for split, counts in (("train", per_class), ("val", (2, 2, 2))):
        for name, count in zip(CLASSES, counts, strict=True):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.randint(0, 255, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / (f"{i}.v1.png" if i % 2 else f"{i}.jpg"))
    return root


@pytest.fixture
def packed(tmp_path):
    root = write_folder(tmp_path / "photos")
    result = pack(root, tmp_path / "shards", shard_size_mb=0.008, seed=0)
    return root, tmp_path / "shards", result


def test_a_root_packs_both_splits_with_indexes_that_match_the_shards(packed):
    root, out, result = packed
    assert [s.prefix for s in result.splits] == ["train", "val"]
    train = ShardIndex.read(out / "train.index.json")
    assert train.classes == list(CLASSES) and train.num_samples == 27 and len(train.shards) > 3
    for entry in train.shards:
        shard = out / entry.name
        assert hashlib.sha256(shard.read_bytes()).hexdigest() == entry.sha256
        assert shard.stat().st_size == entry.bytes <= 0.008 * 1024 * 1024 or len(entry.samples) == 1
    assert ShardIndex.read(out / "val.index.json").num_samples == 6


def test_images_are_stored_unchanged_and_labelled_by_their_class(packed):
    root, out, _ = packed
    originals = {}
    for path in (root / "train").glob("*/*"):
        key = f"{path.parent.name}/{path.name.rsplit('.', 1)[0].replace('.', '_')}"  # WebDataset cuts at a dot
        originals[key] = (path.read_bytes(), CLASSES.index(path.parent.name))
    seen = {}
    for entry in ShardIndex.read(out / "train.index.json").shards:
        data = (out / entry.name).read_bytes()
        for sample in entry.samples:
            seen[sample.key] = (data[sample.offset:sample.offset + sample.size], sample.label)
    assert seen == originals  # every image once, byte for byte, with its class


def test_every_shard_mixes_the_classes_in_their_share(tmp_path):
    labels = np.repeat([0, 1, 2], [600, 300, 100])
    order = stratified_order(labels, seed=0, class_names=CLASSES)
    assert sorted(order.tolist()) == list(range(1000))
    for start in range(0, 1000, 100):  # any 100 consecutive samples: about 60/30/10
        counts = np.bincount(labels[order[start:start + 100]], minlength=3)
        assert abs(counts[0] - 60) <= 2 and abs(counts[1] - 30) <= 2 and abs(counts[2] - 10) <= 2
    assert not np.array_equal(order, stratified_order(labels, seed=1, class_names=CLASSES))


def test_the_same_input_and_seed_pack_to_the_same_bytes(packed, tmp_path):
    root, out, _ = packed
    again = pack(root, tmp_path / "again", shard_size_mb=0.008, seed=0)
    for shard in again.splits[0].shards:
        assert shard.read_bytes() == (out / shard.name).read_bytes()
    other = pack(root, tmp_path / "other", shard_size_mb=0.008, seed=1)
    assert other.splits[0].shards[0].read_bytes() != (out / other.splits[0].shards[0].name).read_bytes()


def test_a_multilabel_list_packs_json_rows(tmp_path):
    root = write_multilabel_squares(tmp_path / "squares")
    result = pack(root / "train_list.txt", tmp_path / "shards", multilabel=True, shard_size_mb=1)
    index = ShardIndex.read(result.splits[0].index_path)
    assert index.multilabel and result.splits[0].prefix == "train_list"
    lines = dict(line.split("\t") for line in (root / "train_list.txt").read_text().splitlines())
    for sample in index.shards[0].samples:
        assert ",".join(map(str, sample.label)) == lines[f"train/{sample.key.split('/')[-1]}.png"]
    with tarfile.open(result.splits[0].shards[0]) as archive:
        assert any(name.endswith(".json") for name in archive.getnames())


def test_the_command_packs_and_its_mistakes_end_in_one_line(packed, tmp_path, monkeypatch, capsys):
    root, out, _ = packed
    assert data_command(["pack", str(root / "train"), "--out", str(tmp_path / "cmd"), "--prefix", "t"],
                        monkeypatch) == ExitCode.OK
    assert "wrote 1 shards of 27 images" in capsys.readouterr().out
    assert data_command(["pack", str(root / "train"), "--out", str(tmp_path / "cmd"), "--prefix", "t"],
                        monkeypatch) == ExitCode.USER_ERROR
    assert "--force" in capsys.readouterr().err
    assert data_command(["pack", str(tmp_path / "missing"), "--out", str(tmp_path / "x")], monkeypatch) == \
        ExitCode.USER_ERROR
    with pytest.raises(UserError, match="--shard-size 0"):
        pack(root, tmp_path / "y", shard_size_mb=0)


def test_pack_needs_no_framework(packed, tmp_path):
    root, _, _ = packed
    code = ("import sys\nfrom paddletrain.data.__main__ import main\n"
            f"main(['pack', {str(root)!r}, '--out', {str(tmp_path / 'nf')!r}])\n"
            "print('paddle loaded' if 'paddle' in sys.modules else 'no paddle')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "no paddle", result.stderr[-2000:]


def test_webdataset_reads_what_pack_writes(packed):
    wds = pytest.importorskip("webdataset")
    _, out, result = packed
    index = ShardIndex.read(out / "train.index.json")
    urls = [str(p) for p in result.splits[0].shards]
    read = {s["__key__"]: (int(s["cls"]), s["png"] if "png" in s else s["jpg"])
            for s in wds.WebDataset(urls, shardshuffle=False).decode("pil")}
    expected = {s.key: s.label for e in index.shards for s in e.samples}
    assert {k: v[0] for k, v in read.items()} == expected
    assert all(image.size == (10, 10) for _, image in read.values())


def test_shards_written_by_webdataset_and_by_tar_scan_like_packs(tmp_path):
    wds = pytest.importorskip("webdataset")
    images = [np.full((8, 8, 3), 40 * i, np.uint8) for i in range(5)]
    with wds.TarWriter(str(tmp_path / "wds-000000.tar")) as sink:
        for i, pixels in enumerate(images):
            sink.write({"__key__": f"sample{i:04d}", "png": pixels, "cls": i % 2})
    path = tmp_path / "wds-000000.tar"
    with open(path, "rb") as file:
        scan = scan_shard(file, path.stat().st_size, num_classes=2)
    assert not scan.problems and [s.label for s in scan.samples] == [0, 1, 0, 1, 0]
    data = path.read_bytes()
    first = scan.samples[0]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data[first.offset:first.offset + first.size]))), images[0])
    if shutil.which("tar") is None:
        pytest.skip("no tar command on this machine")
    folder = tmp_path / "by_tar"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(images[i]).save(folder / f"k{i}.png")
        (folder / f"k{i}.cls").write_text(str(i % 2))
    subprocess.run(["tar", "-cf", str(tmp_path / "tar-000000.tar"), "-C", str(folder),
                    *sorted(p.name for p in folder.iterdir())], check=True)
    with open(tmp_path / "tar-000000.tar", "rb") as file:
        scan = scan_shard(file, (tmp_path / "tar-000000.tar").stat().st_size)
    assert [(s.key, s.label) for s in scan.samples] == [("k0", 0), ("k1", 1), ("k2", 0)]


def test_an_index_from_elsewhere_is_checked(tmp_path):
    from paddletrain.data.shards.index import ShardIndexError

    good = {"format": "paddletrain-shards", "version": 1, "classes": ["a"], "multilabel": False,
            "shards": [{"name": "s.tar", "sha256": None, "bytes": 100, "samples": [["k", "jpg", 0, 50, 0]]}]}
    assert ShardIndex.from_bytes(json.dumps(good).encode(), "i").num_samples == 1
    for change, needle in ((("name", "../s.tar"), "plain file name"), (("bytes", -1), "bytes"),
                           (("samples", [["k", "jpg", 90, 50, 0]]), "within the shard"),
                           (("samples", [["k", "exe", 0, 5, 0]]), "extension"),
                           (("samples", [["k", "jpg", 0, 5, 3]]), "class index below 1")):
        bad = json.loads(json.dumps(good))
        bad["shards"][0][change[0]] = change[1]
        with pytest.raises(ShardIndexError, match=needle):
            ShardIndex.from_bytes(json.dumps(bad).encode(), "i")
    with pytest.raises(ShardIndexError, match="not a JSON"):
        ShardIndex.from_bytes(b"\xff{", "i")
