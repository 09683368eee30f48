"""The WebDataset layout of a tar shard: members ``<key>.<ext>``, a sample being the members that share a key.

WebDataset's rule, which paddletrain follows both ways: a member's key is its path up to the first dot of its
base name and the rest is its extension, lower-cased (``n01440764/img_001.JPEG`` is key ``n01440764/img_001``,
extension ``jpeg``; ``a/b.seg.png`` is key ``a/b``, extension ``seg.png``). A sample is a run of consecutive
members with one key. paddletrain reads one image (the first of :data:`IMAGE_EXTENSIONS` present) and one label:
``cls``, a class index as decimal text, or ``json``, a multi-hot list of 0/1 (one per class). Other members (a
``txt`` caption, say) are passed over.

A shard may come from someone else, so nothing of it is trusted (:func:`scan_shard`):

- it is never extracted: members are read in place, by offset, so no name can write anywhere;
- a name that is absolute, has a ``..`` part, a NUL or a control character, or a member that is not a regular
  file (a link, a device, a FIFO), is a problem of its sample, never followed;
- a member larger than ``max_member_bytes`` is a problem (an image) or refused unread (a label over 64 KiB);
- a header that does not parse, or a member whose data runs past the end of the file (a truncated shard), is
  named with its byte offset.

Problems are returned, not raised: the dataset applies ``data.bad_sample_policy`` to them.
"""
from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "bmp", "tif", "tiff", "webp")
LABEL_EXTENSIONS = ("cls", "json")
# A label is a number or a short list; anything longer is not read at all.
MAX_LABEL_BYTES = 64 * 1024
DEFAULT_MAX_MEMBER_BYTES = 64 * 1024 * 1024


def split_name(name: str) -> tuple[str, str]:
    """``(key, extension)`` of a member name by WebDataset's rule (the first dot of the base name)."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{head}/{stem}" if head else stem
    return key, ext.lower() if dot else ""


def unsafe_name(name: str) -> str | None:
    """Why a member name is refused, or None: absolute, a ``..`` part, empty, NUL or control characters."""
    if not name or name.startswith("/") or "\\" in name:
        return "an absolute, empty or backslashed name"
    if any(part == ".." for part in name.split("/")):
        return "a '..' part"
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        return "a control character"
    return None


@dataclass(frozen=True)
class Problem:
    """Something of a shard that cannot be a sample: where (member or key), what, and the byte offset."""

    where: str
    reason: str
    offset: int

    def __str__(self) -> str:
        return f"{self.where} (byte {self.offset}): {self.reason}"


@dataclass
class Sample:
    """One sample of a shard: its key, where its image's bytes are, and its label (class index or multi-hot)."""

    key: str
    image_ext: str
    offset: int
    size: int
    label: int | list[int]


@dataclass
class ShardScan:
    """What :func:`scan_shard` found: the samples in shard order, the problems, and the bytes read to the end."""

    samples: list[Sample] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # True when the shard ended early (a truncated or corrupt archive): the samples before that point are kept.
    broken: bool = False


def parse_label(ext: str, data: bytes, num_classes: int | None) -> int | list[int]:
    """A ``cls`` or ``json`` member's label.

    Raises:
        ValueError: not a non-negative decimal integer (``cls``), not a list of 0/1 (``json``), or out of range.
    """
    text = data.decode("utf-8").strip()
    if ext == "cls":
        if not text.isdigit():
            raise ValueError(f"a .cls label must be a class index, got {text[:40]!r}")
        label = int(text)
        if num_classes is not None and label >= num_classes:
            raise ValueError(f"class index {label} is outside [0, {num_classes})")
        return label
    value = json.loads(text)
    if isinstance(value, dict):  # {"labels": [...]} is accepted too: a common way to write one
        value = value.get("labels")
    if not isinstance(value, list) or not value or any(v not in (0, 1) or isinstance(v, bool) for v in value):
        raise ValueError("a .json label must be a multi-hot list of 0/1, one per class")
    if num_classes is not None and len(value) != num_classes:
        raise ValueError(f"a multi-hot label of {len(value)} values for {num_classes} classes")
    return [int(v) for v in value]


@dataclass
class _Pending:
    """The members of the key being read: its image, its label, or the first reason it cannot be a sample."""

    key: str
    offset: int
    image: tuple[str, int, int] | None = None
    label: int | list[int] | None = None
    bad: Problem | None = None

    def refuse(self, where: str, reason: str) -> None:
        if self.bad is None:
            self.bad = Problem(where, reason, self.offset)


class _Grouper:
    """Members in, samples and problems out (the samples of a run of members with one key)."""

    def __init__(self, scan: ShardScan, label_ext: str, num_classes: int | None, max_member_bytes: int) -> None:
        self.scan, self.label_ext = scan, label_ext
        self.num_classes, self.max_member_bytes = num_classes, max_member_bytes
        self.pending: _Pending | None = None

    def add(self, info: tarfile.TarInfo, read: Callable[[], bytes]) -> None:
        key, ext = split_name(info.name)
        if self.pending is None or key != self.pending.key:
            self.close()
            self.pending = _Pending(key, info.offset)
        sample, name = self.pending, info.name
        reason = unsafe_name(name)
        if reason is None and not info.isfile():
            reason = "not a regular file (a link, device or FIFO): not followed"
        if reason is not None:
            sample.refuse(name, f"member {name!r} refused: {reason}")
        elif ext in IMAGE_EXTENSIONS and sample.image is None:
            if info.size > self.max_member_bytes:
                sample.refuse(name, f"image of {info.size} bytes, larger than the bound of {self.max_member_bytes}")
            else:
                sample.image = (ext, info.offset_data, info.size)
        elif ext == self.label_ext:
            if info.size > MAX_LABEL_BYTES:
                sample.refuse(name, f"label of {info.size} bytes, larger than {MAX_LABEL_BYTES}: not read")
                return
            try:
                sample.label = parse_label(ext, read(), self.num_classes)
            except (ValueError, UnicodeDecodeError) as exc:
                sample.refuse(name, f"label {name!r}: {exc}")

    def close(self) -> None:
        sample, self.pending = self.pending, None
        if sample is None:
            return
        if sample.bad is not None:
            self.scan.problems.append(sample.bad)
        elif sample.image is None:
            self.scan.problems.append(Problem(sample.key, "no image member (" + ", ".join(IMAGE_EXTENSIONS) + ")",
                                              sample.offset))
        elif sample.label is None:
            self.scan.problems.append(Problem(sample.key, f"no .{self.label_ext} label member", sample.offset))
        else:
            self.scan.samples.append(Sample(sample.key, *sample.image, sample.label))

    def broken_at(self, info: tarfile.TarInfo) -> None:
        """The shard broke inside ``info``: its sample is lost, the one before it is complete."""
        if self.pending is not None and self.pending.key != split_name(info.name)[0]:
            self.close()
        self.pending = None


def scan_shard(file: BinaryIO, size: int, *, num_classes: int | None = None, multilabel: bool = False,
               max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES) -> ShardScan:
    """Walk the tar headers of ``file`` (``size`` bytes; seekable) and group its members into samples.

    Reads only the headers and the label members: images stay where they are (their offsets are recorded).
    """
    scan = ShardScan()
    try:
        archive = tarfile.open(fileobj=file, mode="r:")
    except tarfile.TarError as exc:
        scan.problems.append(Problem("(shard)", f"not a tar archive: {exc}", 0))
        scan.broken = True
        return scan
    grouper = _Grouper(scan, "json" if multilabel else "cls", num_classes, max_member_bytes)
    while (info := _next_member(archive, file, scan)) is not None:
        if info.isdir():
            continue
        if info.offset_data + info.size > size:
            scan.problems.append(Problem(info.name, f"its data ends at byte {info.offset_data + info.size}, past "
                                         f"the shard's end ({size} bytes): the shard is truncated", info.offset))
            scan.broken = True
            grouper.broken_at(info)
            break
        grouper.add(info, lambda info=info: _member_bytes(archive, info))
    grouper.close()
    return scan


def _next_member(archive: tarfile.TarFile, file: BinaryIO, scan: ShardScan) -> tarfile.TarInfo | None:
    """The next member's header, or None at the end; a header that does not parse ends the scan as broken."""
    header_at = archive.offset
    try:
        info = archive.next()
    except tarfile.TarError as exc:
        scan.problems.append(Problem("(shard)", f"a header that does not parse: {exc}", header_at))
        scan.broken = True
        return None
    if info is None:
        # tarfile ends quietly at a header it cannot parse, as at the end: only zero blocks may follow.
        file.seek(header_at)
        if file.read(tarfile.BLOCKSIZE).strip(b"\0"):
            scan.problems.append(Problem("(shard)", "a header that does not parse (a corrupt shard): the samples "
                                         "after it are lost", header_at))
            scan.broken = True
    return info


def _member_bytes(archive: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    extracted = archive.extractfile(info)
    return extracted.read() if extracted is not None else b""


def member_info(name: str, size: int, mtime: float = 0.0) -> tarfile.TarInfo:
    """The header of a regular file ``name`` of ``size`` bytes (mode 0644, owner 0, ``mtime``): a shard's bytes do
    not depend on who packed it or when, so the same input packs to the same checksums."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = int(mtime)
    return info


def member_bytes(info: tarfile.TarInfo, archive: tarfile.TarFile) -> int:
    """How many bytes ``info`` and its data take in ``archive``: its header(s), and the data padded to 512."""
    header = info.tobuf(archive.format, archive.encoding, archive.errors)
    return len(header) + -(-info.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def write_member(archive: tarfile.TarFile, info: tarfile.TarInfo, data: bytes) -> None:
    """Add ``data`` under the header ``info`` (:func:`member_info`)."""
    archive.addfile(info, io.BytesIO(data))

