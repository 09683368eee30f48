"""ImageFolderDataset: layout scanning, validation errors that name the path, decoding, class names."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data.datasets import BadSampleError, DatasetError, build_datasets
from paddletrain.data.formats.imagefolder import ImageFolderDataset, is_image_file


def _write(path: Path, size=(12, 9), color=(200, 10, 10), fmt=None, mode="RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color if mode != "P" else 1).save(path, format=fmt)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small untidy dataset: mixed sizes and formats, a space in a name, a GIF and hidden files to ignore."""
    root = tmp_path / "data"
    _write(root / "train/cat/1.jpg", size=(20, 16))
    _write(root / "train/cat/my cat 2.PNG", size=(8, 8), color=(0, 255, 0))
    _write(root / "train/cat/sub/3.jpeg", size=(10, 30))
    _write(root / "train/cat/anim.gif", fmt="GIF", mode="P")
    _write(root / "train/cat/.hidden.png")
    (root / "train/cat/notes.txt").write_text("not an image")
    _write(root / "train/dog/a.bmp", color=(1, 2, 3))
    _write(root / "train/dog/b.webp", size=(33, 17))
    _write(root / "train/.cache/x.png")
    _write(root / "val/dog/v1.png", color=(9, 9, 9))
    _write(root / "val/cat/v2.jpg")
    return root


def test_scan_orders_classes_and_ignores_non_images(tree: Path) -> None:
    ds = ImageFolderDataset(tree, "train")
    assert ds.classes == ["cat", "dog"]
    names = [Path(ds.describe(i)).name for i in range(len(ds))]
    assert sorted(names) == sorted(["1.jpg", "my cat 2.PNG", "3.jpeg", "a.bmp", "b.webp"])
    assert ds.targets.tolist() == [0, 0, 0, 1, 1]
    assert ds.in_chans == 3
    val = ImageFolderDataset(tree, "val")
    assert val.classes == ["cat", "dog"]
    assert [Path(val.describe(i)).name for i in range(len(val))] == ["v2.jpg", "v1.png"]
    assert val.targets.tolist() == [0, 1]


def test_is_image_file_cases() -> None:
    assert is_image_file("a/B.JPG") and is_image_file("x.WebP") and is_image_file("with space.png")
    assert not is_image_file("a.gif") and not is_image_file(".a.png") and not is_image_file("a.png.txt")


def test_getitem_decodes_rgb_and_grayscale_of_any_size(tree: Path) -> None:
    ds = ImageFolderDataset(tree, "train")
    index = [Path(ds.describe(i)).name for i in range(len(ds))].index("b.webp")
    image, label = ds[index]
    assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (33, 17)
    assert label.dtype == np.int64 and label == 1
    gray = ImageFolderDataset(tree, "train", in_chans=1)
    assert gray.load_image(index).mode == "L"
    bmp = [Path(ds.describe(i)).name for i in range(len(ds))].index("a.bmp")
    np.testing.assert_array_equal(np.asarray(ds.load_image(bmp)), np.full((9, 12, 3), [1, 2, 3], np.uint8))


def test_transform_is_applied(tree: Path) -> None:
    ds = ImageFolderDataset(tree, "val", transform=lambda im: np.asarray(im).shape)
    assert ds[1][0] == (9, 12, 3)


def test_corrupt_image_names_the_file(tree: Path) -> None:
    bad = tree / "train/dog/broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    ds = ImageFolderDataset(tree, "train")
    index = [ds.describe(i) for i in range(len(ds))].index(str(bad))
    with pytest.raises(BadSampleError, match="broken.png") as info:
        ds[index]
    assert info.value.index == index and info.value.describe == str(bad)


@pytest.mark.parametrize(
    "breakage, culprit",
    [
        (lambda root: root.rename(root.parent / "elsewhere"), "data"),
        (lambda root: (root / "val/cat/v2.jpg").unlink() or (root / "val/cat").rmdir() or
         (root / "val/dog/v1.png").unlink() or (root / "val/dog").rmdir(), "val"),
        (lambda root: (root / "val").rename(root / "validation"), "val"),
        (lambda root: _write(root / "val/horse/h.png"), "horse"),
        (lambda root: (root / "train/dog/a.bmp").unlink() or (root / "train/dog/b.webp").unlink(), "dog"),
    ],
    ids=["missing-root", "no-val-classes", "missing-split", "unknown-val-class", "empty-class"],
)
def test_layout_errors_name_the_path(tree: Path, breakage, culprit: str) -> None:
    breakage(tree)
    with pytest.raises(DatasetError) as info:
        for split in ("train", "val"):
            ImageFolderDataset(tree, split)
    message = str(info.value)
    assert str(tree) in message and culprit in message


def test_no_class_directories_in_train(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    _write(tmp_path / "train/loose.png")
    with pytest.raises(DatasetError, match="no class directories in .*train"):
        ImageFolderDataset(tmp_path, "train")


def test_class_names_file(tree: Path, tmp_path: Path) -> None:
    names = tmp_path / "names.txt"
    names.write_text("Felis catus\nCanis familiaris\n\n")
    ds = ImageFolderDataset(tree, "train", class_names=names)
    assert ds.classes == ["Felis catus", "Canis familiaris"]
    assert ds.class_dirs == ["cat", "dog"]
    # A relative name is also looked up inside the dataset root.
    (tree / "labels.txt").write_text("Cat\nDog\n")
    assert ImageFolderDataset(tree, "val", class_names="labels.txt").classes == ["Cat", "Dog"]


@pytest.mark.parametrize("text, match", [("only one\n", "has 1 names but .* 2 class"), ("a\n\nb\n", "blank line")])
def test_bad_class_names_file(tree: Path, tmp_path: Path, text: str, match: str) -> None:
    names = tmp_path / "names.txt"
    names.write_text(text)
    with pytest.raises(DatasetError, match=match) as info:
        ImageFolderDataset(tree, "train", class_names=names)
    assert str(names) in str(info.value)


def test_missing_class_names_file(tree: Path) -> None:
    with pytest.raises(DatasetError, match="nope.txt"):
        ImageFolderDataset(tree, "train", class_names="nope.txt")


def test_factory_builds_both_splits(tree: Path) -> None:
    splits = build_datasets(DataConfig(name="imagefolder", root=str(tree)), eval_transform=np.asarray)
    assert splits.classes == ["cat", "dog"] and splits.in_chans == 3
    assert len(splits.train) == 5 and len(splits.val) == 2
    assert isinstance(splits.val[0][0], np.ndarray) and isinstance(splits.train[0][0], Image.Image)


def test_factory_requires_root() -> None:
    with pytest.raises(DatasetError, match="data.root"):
        build_datasets(DataConfig(name="imagefolder"))
