"""Hostile or strange image folders and files: symlink loops and escapes, FIFOs, 16-bit images, bombs, odd types.

Each case was reproduced on the code before the fix: a symlink loop gave 41 copies of each image, a link to
``../..`` put 160 validation images into training, a link to ``/`` hung the scan, a FIFO named ``x.jpg`` hung
``fit`` forever (even SIGTERM could not stop it), and a 16-bit gradient decoded to 0, 255, 255, ... (clipped).
"""
from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import sys
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data import build_loader, preprocessing_info
from paddletrain.data.datasets import BadSampleError, DatasetError
from paddletrain.data.formats import folder_scan, imagefolder
from paddletrain.data.formats.imagefolder import ImageFolderDataset
from paddletrain.data.formats.images import IMG_EXTENSIONS, ImageReadError, open_image, to_mode
from paddletrain.deploy.decoding import load_batch
from paddletrain.deploy.predictor import Preprocessing
from tests.conftest import run_module

pytestmark = pytest.mark.timeout(120)  # every case here used to hang or explode: fail, don't wait

PER_CLASS = {"train": 3, "val": 2}


def _tree(root: Path) -> Path:
    """root/{train,val}/{a,b}/<split><i>.png, 3 train and 2 val images per class, each a different colour."""
    for split, n in PER_CLASS.items():
        for c, name in enumerate("ab"):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (8, 8), (40 * i, 100 * c, 7)).save(folder / f"{split}{i}.png")
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return _tree(tmp_path / "data")


def _names(ds: ImageFolderDataset) -> list[str]:
    return [os.path.relpath(ds.describe(i), ds.root) for i in range(len(ds))]


def _png(path: Path, pixels: np.ndarray, color_type: int, size: tuple[int, int] | None = None) -> Path:
    """A 16-bit-per-channel PNG written by hand (PIL cannot write 48-bit RGB); ``size`` may lie in the header."""
    height, width = pixels.shape[:2]
    rows = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", *(size or (width, height)), 16, color_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))
    return path


# --- symlinks: never leave the root, never visit twice, say what was skipped ---------------------------------


def test_symlink_loops_are_walked_once(root: Path) -> None:
    (root / "train/a/loop").symlink_to("..")        # the split directory: 41 copies of each image before
    (root / "train/a/self").symlink_to(".")
    (root / "train/b/deep").mkdir()
    (root / "train/b/deep/back").symlink_to("../..")  # the split directory again, from one level down
    ds = ImageFolderDataset(root, "train")
    assert sorted(_names(ds)) == sorted(f"train/{c}/train{i}.png" for c in "ab" for i in range(3))
    assert ds.scan_report.skipped[folder_scan.VISITED] == 3


def test_links_into_the_other_split_do_not_leak_validation_images(root: Path) -> None:
    (root / "train/a/up").symlink_to("../..")                     # the data root, which holds val
    (root / "train/a/valdir").symlink_to("../../val/b")            # a val class
    (root / "train/b/v.png").symlink_to("../../val/a/val0.png")     # one val image
    train = ImageFolderDataset(root, "train")
    assert not [name for name in _names(train) if "val" in name]
    assert len(train) == 6
    assert train.scan_report.skipped[folder_scan.OTHER_SPLIT] == 2
    assert train.scan_report.skipped[folder_scan.VISITED] == 1   # the root is an ancestor: a loop
    (root / "val/a/t.png").symlink_to("../../train/a/train0.png")  # and the other way round
    val = ImageFolderDataset(root, "val")
    assert len(val) == 4 and val.scan_report.skipped[folder_scan.OTHER_SPLIT] == 1


def test_link_to_the_filesystem_root_is_skipped_at_once_and_named(root: Path, caplog) -> None:
    (root / "train/a/root").symlink_to("/")
    (root / "train/a/passwd.png").symlink_to("/etc/passwd")
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        ds = ImageFolderDataset(root, "train")
    assert time.monotonic() - started < 5  # it hung before
    assert len(ds) == 6 and ds.scan_report.skipped[folder_scan.OUTSIDE_ROOT] == 2
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "train: skipped 2 symlinks out of root" in warning and "train/a/root' -> '/'" in warning
    assert "point data.root at the folder" in warning


def test_links_inside_the_root_are_followed_and_counted_once(root: Path) -> None:
    """A shared store under data.root, used through file and directory links, gives each image once."""
    store = root / "store"
    store.mkdir()
    for name in ("s1.png", "s2.png"):
        Image.new("RGB", (8, 8)).save(store / name)
    (root / "train/a/s1.png").symlink_to("../../store/s1.png")
    (root / "train/a/again.png").symlink_to("../../store/s1.png")  # the same file twice
    (root / "train/b/store").symlink_to("../../store")             # s1 again (already linked) and s2
    (root / "train/b/mine.png").symlink_to("train0.png")           # an image already in the class
    ds = ImageFolderDataset(root, "train")
    names = _names(ds)
    assert len(names) == 8 and len(set(names)) == 8
    assert "train/a/again.png" in names and "train/b/store/s2.png" in names  # sorted order decides the first
    assert ds.scan_report.skipped[folder_scan.VISITED] == 3


def test_a_link_into_another_class_keeps_images_in_their_own_class(root: Path) -> None:
    (root / "train/a/bdir").symlink_to("../b")
    (root / "train/a/b0.png").symlink_to("../b/train0.png")
    ds = ImageFolderDataset(root, "train")
    assert [ds.targets[i] for i, name in enumerate(_names(ds)) if name.startswith("train/b/")] == [1, 1, 1]
    assert ds.targets.tolist().count(0) == 3 and ds.scan_report.skipped[folder_scan.VISITED] == 2


def test_a_class_directory_linked_outside_the_root_says_how_to_proceed(root: Path, tmp_path: Path) -> None:
    outside = _tree(tmp_path / "store")
    for path in (root / "train/b").iterdir():
        path.unlink()
    (root / "train/b").rmdir()
    (root / "train/b").symlink_to(outside / "train/b")
    with pytest.raises(DatasetError) as info:
        ImageFolderDataset(root, "train")
    message = str(info.value)
    assert "train/b' has no images" in message and str(outside / "train/b") in message
    assert "point data.root at the folder" in message
    # A class linked to a folder inside the root is an ordinary class.
    (root / "train/b").unlink()
    (root / "elsewhere").mkdir()
    Image.new("RGB", (8, 8)).save(root / "elsewhere/x.png")
    (root / "train/b").symlink_to("../elsewhere")
    assert _names(ImageFolderDataset(root, "train"))[-1] == "train/b/x.png"


def test_splits_that_share_a_folder_are_refused(root: Path) -> None:
    for path in (root / "val").rglob("*.png"):
        path.unlink()
    for folder in ("a", "b"):
        (root / "val" / folder).rmdir()
    (root / "val").rmdir()
    (root / "val").symlink_to("train")
    with pytest.raises(DatasetError, match="overlap"):
        ImageFolderDataset(root, "val")


def test_broken_links_and_unreadable_folders_are_reported(root: Path, caplog) -> None:
    (root / "train/a/gone.png").symlink_to("nowhere.png")
    (root / "train/a/cycle.png").symlink_to("cycle.png")
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        ds = ImageFolderDataset(root, "train")
    assert len(ds) == 6 and ds.scan_report.skipped[folder_scan.BROKEN_LINK] == 2
    assert any("2 broken symlinks" in r.getMessage() and "gone.png" in r.getMessage() for r in caplog.records)


def test_each_real_directory_is_listed_once_however_many_links_lead_to_it(root: Path, monkeypatch) -> None:
    """Bounded work: a chain of 30 nested folders, each with links to every level above, is listed once each."""
    folder = root / "train/a"
    for depth in range(30):
        folder = folder / f"d{depth}"
        folder.mkdir()
        Image.new("RGB", (4, 4)).save(folder / "x.png")
        for up in range(1, depth + 3):
            (folder / f"up{up}").symlink_to("/".join([".."] * up))
    listed = []
    real_scandir = os.scandir
    monkeypatch.setattr(imagefolder.os, "scandir", lambda path: listed.append(os.path.realpath(path))
                        or real_scandir(path))
    ds = ImageFolderDataset(root, "train")
    assert len(ds) == 6 + 30
    walked = [path for path in listed if path.startswith(os.path.realpath(root / "train") + os.sep)]
    assert len(walked) == len(set(walked)) == 2 + 30  # the two classes and the 30 folders


# --- non-regular files --------------------------------------------------------------------------------------


def _make_special(path: Path, kind: str) -> object:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        return server
    else:
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: reading it never ends
        except PermissionError:
            pytest.skip("creating a character device needs CAP_MKNOD")
    return None


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_non_regular_files_are_skipped_unopened(root: Path, kind: str, caplog) -> None:
    keep = _make_special(root / "train/a/x.jpg", kind)
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        ds = ImageFolderDataset(root, "train")
    assert len(ds) == 6 and ds.scan_report.skipped[folder_scan.NON_REGULAR] == 1
    [warning] = [r.getMessage() for r in caplog.records]
    assert "x.jpg" in warning and "non-regular" in warning and "block forever" in warning
    # Swapped in after the scan, it is a bad sample naming the file (the loader's policy decides), not a hang.
    target = root / "train/a/train0.png"
    target.unlink()
    os.mkfifo(target)
    index = _names(ds).index("train/a/train0.png")
    with pytest.raises(BadSampleError, match="train0.png.*a FIFO, not a regular file"):
        ds[index]
    del keep


def test_predict_decoding_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    preprocessing = Preprocessing(preprocessing_info(OmegaConf.structured(DataConfig(image_size=8))))
    good = tmp_path / "good.png"
    Image.new("RGB", (8, 8)).save(good)
    os.mkfifo(tmp_path / "x.jpg")
    ok, inputs, failures = load_batch([str(tmp_path / "x.jpg"), str(good)], preprocessing)
    assert ok == [str(good)] and inputs.shape == (1, 3, 8, 8)
    assert failures == [(str(tmp_path / "x.jpg"), "a FIFO, not a regular file: not read (it could block forever)")]


def test_fit_on_a_folder_with_a_fifo_finishes(root: Path, tmp_path: Path) -> None:
    """Through the real CLI: before the fix this run never ended, and SIGTERM could not stop it either."""
    os.mkfifo(root / "train/a/x.jpg")
    result = run_module("paddletrain.fit", [
        "data.name=imagefolder", f"data.root={root}", "data.image_size=8", "data.batch_size=4",
        "data.num_workers=0", "trainer.max_epochs=1", "callbacks.progress_bar.enabled=false", "trainer.cpu_threads=1",
        f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stdout + result.stderr
    assert "train: 6 images in 2 classes; skipped 0 by extension, 0 symlinks out of root, 1 non-regular files" in log
    assert "x.jpg' (a FIFO)" in log


# --- 16-bit and other pixel formats --------------------------------------------------------------------------


def test_a_16_bit_gradient_decodes_to_the_expected_8_bit_values(tmp_path: Path) -> None:
    gradient = (np.arange(256, dtype=np.uint16) * 257).reshape(1, 256).repeat(3, axis=0)
    gradient[2] = np.random.default_rng(0).integers(0, 65536, 256)
    expected = (gradient >> 8).astype(np.uint8)
    path = tmp_path / "g16.png"
    Image.fromarray(gradient).save(path)
    assert Image.open(path).mode == "I;16"
    assert np.asarray(Image.open(path).convert("L"))[0, 1:].max() == 255  # what PIL alone gives: clipped
    np.testing.assert_array_equal(np.asarray(open_image(path, "L")), expected)
    np.testing.assert_array_equal(np.asarray(open_image(path, "RGB")), np.repeat(expected[..., None], 3, axis=2))
    np.testing.assert_array_equal(expected[0], np.arange(256))


def test_16_bit_files_of_every_kind_decode_alike(tmp_path: Path) -> None:
    """Grey PNG (I;16), big-endian PGM (mode I), 48-bit RGB PNG and TIFF all give value >> 8."""
    values = np.array([[0, 255, 256, 4660, 32768, 65280, 65535]], dtype=np.uint16)
    expected = (values >> 8).astype(np.uint8)
    pgm = tmp_path / "g.pgm"
    pgm.write_bytes(b"P5 7 1 65535\n" + values.astype(">u2").tobytes())
    tiff = tmp_path / "g.tiff"
    Image.fromarray(values).save(tiff)
    rgb = _png(tmp_path / "rgb48.png", np.stack([values, values, 65535 - values], axis=-1), color_type=2)
    for path in (pgm, tiff):
        np.testing.assert_array_equal(np.asarray(open_image(path, "L")), expected, err_msg=path.name)
    np.testing.assert_array_equal(np.asarray(open_image(rgb, "RGB"))[..., 0], expected)
    np.testing.assert_array_equal(np.asarray(open_image(rgb, "RGB"))[..., 2], ((65535 - values) >> 8))


def test_16_bit_images_are_scaled_in_training_and_in_predict_preprocessing(root: Path) -> None:
    path = root / "train/a/deep16.png"
    Image.fromarray(np.full((8, 8), 32896, np.uint16)).save(path)  # 128 * 257: mid grey
    ds = ImageFolderDataset(root, "train")
    image = ds.load_image(_names(ds).index("train/a/deep16.png"))
    assert np.asarray(image).min() == np.asarray(image).max() == 128
    info = preprocessing_info(OmegaConf.structured(DataConfig(image_size=8, mean=[0.0], std=[1.0])))
    with Image.open(path) as opened:  # a user handing an I;16 image straight to the predictor
        np.testing.assert_allclose(Preprocessing(info)(opened), 128 / 255, rtol=1e-6)
    np.testing.assert_allclose(Preprocessing(info)(np.full((8, 8), 32896, np.uint16)), 128 / 255, rtol=1e-6)


def test_float_and_32_bit_images_are_refused_loudly(root: Path) -> None:
    path = root / "train/a/float.tiff"
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(path)
    big = Image.fromarray(np.full((4, 4), 70000, np.int32))
    ds = ImageFolderDataset(root, "train")
    with pytest.raises(BadSampleError, match="float.tiff.*'F'.*no known range"):
        ds[_names(ds).index("train/a/float.tiff")]
    with pytest.raises(ImageReadError, match="70000..70000, beyond 16 bits"):
        to_mode(big, "RGB")


# --- extensions and the per-split summary --------------------------------------------------------------------


def test_the_summary_line_counts_what_was_skipped_by_reason_and_extension(root: Path, caplog) -> None:
    Image.new("P", (8, 8)).save(root / "train/a/anim.gif")
    (root / "train/b/notes.txt").write_text("not an image")
    (root / "train/b/README").write_text("no extension")
    (root / "train/b/.DS_Store").write_bytes(b"\0")
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        ImageFolderDataset(root, "train")
        ImageFolderDataset(root, "val")
    assert [r.getMessage() for r in caplog.records] == [
        "train: 6 images in 2 classes; skipped 3 by extension ((no extension): 1, .gif: 1, .txt: 1), "
        "0 symlinks out of root, 0 non-regular files, 1 hidden",
        "val: 4 images in 2 classes; skipped 0 by extension, 0 symlinks out of root, 0 non-regular files",
    ]


def test_every_accepted_extension_decodes(root: Path) -> None:
    """The list is torchvision's; each entry is a format Pillow reads here (GIF stays out, as there)."""
    assert ".gif" not in IMG_EXTENSIONS
    formats = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".ppm": "PPM", ".pgm": "PPM", ".bmp": "BMP",
               ".tif": "TIFF", ".tiff": "TIFF", ".webp": "WEBP"}
    assert sorted(formats) == sorted(IMG_EXTENSIONS)
    for ext, fmt in formats.items():
        Image.new("L" if ext == ".pgm" else "RGB", (6, 5), 90).save(root / f"train/b/img{ext.upper()}", format=fmt)
    ds = ImageFolderDataset(root, "train")
    assert len(ds) == 6 + len(formats)
    for index, name in enumerate(_names(ds)):
        image = ds.load_image(index)
        assert image.mode == "RGB" and image.size in ((8, 8), (6, 5)), name


def test_a_multi_page_file_gives_its_first_page(tmp_path: Path) -> None:
    path = tmp_path / "pages.tiff"
    pages = [Image.new("RGB", (6, 4), (10 * i, 0, 0)) for i in range(1, 4)]
    pages[0].save(path, save_all=True, append_images=pages[1:])
    image = open_image(path, "RGB")  # the file is closed by now: the pixels must not need it
    np.testing.assert_array_equal(np.asarray(image), np.asarray(pages[0]))


# --- decompression bombs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", [10_000, 20_000], ids=["above-limit-pil-only-warns", "above-twice-the-limit"])
def test_a_decompression_bomb_is_a_bad_sample_naming_the_file(root: Path, side: int) -> None:
    """A 100/400-megapixel header over a few bytes of data: refused from the header, before any decoding."""
    assert side * side > Image.MAX_IMAGE_PIXELS
    _png(root / "train/a/bomb.png", np.zeros((1, 1), np.uint16), color_type=0, size=(side, side))
    ds = ImageFolderDataset(root, "train")
    index = _names(ds).index("train/a/bomb.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning slips through as a mere warning
        with pytest.raises(BadSampleError, match=r"bomb.png.*exceeds limit of .* pixels.*MAX_IMAGE_PIXELS"):
            ds[index]


def test_the_loader_applies_the_bad_sample_policy_to_a_bomb(root: Path, caplog) -> None:
    _png(root / "train/a/bomb.png", np.zeros((1, 1), np.uint16), color_type=0, size=(10_000, 10_000))
    cfg = OmegaConf.structured(DataConfig(name="imagefolder", root=str(root), image_size=8, batch_size=7))
    ds = ImageFolderDataset(root, "train", transform=np.asarray)
    with pytest.raises(BadSampleError, match="bomb.png"):
        list(build_loader(ds, cfg, train=False, seed=0))
    cfg.bad_sample_policy, cfg.max_bad_fraction = "skip", 0.5
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        [(images, labels)] = list(build_loader(ds, cfg, train=False, seed=0))
    assert len(labels) == 6 and any("bomb.png" in r.getMessage() for r in caplog.records)


if sys.platform != "linux":  # FIFOs, sockets and devices as tested here are POSIX; the scan is too
    pytestmark = [pytestmark, pytest.mark.skip(reason="needs a POSIX filesystem (mkfifo, symlinks)")]
