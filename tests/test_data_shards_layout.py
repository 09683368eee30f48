"""The WebDataset layout and the checks a shard from elsewhere must pass (paddletrain.data.shards.layout)."""
from __future__ import annotations

import io
import tarfile

import pytest

from paddletrain.data.shards.layout import parse_label, scan_shard, split_name, unsafe_name


def _tar(members: list[tuple[str, bytes]], kind: bytes = tarfile.REGTYPE) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _scan(data: bytes, **options):
    return scan_shard(io.BytesIO(data), len(data), **options)


def test_keys_and_extensions_follow_webdatasets_first_dot_rule():
    assert split_name("n01/img_001.JPEG") == ("n01/img_001", "jpeg")
    assert split_name("a/b.seg.png") == ("a/b", "seg.png")
    assert split_name("plain") == ("plain", "")
    assert split_name("dir.v2/x.cls") == ("dir.v2/x", "cls")  # dots in folders are part of the key


@pytest.mark.parametrize("name", ["/etc/passwd.jpg", "../up.jpg", "a/../../b.jpg", "a\\b.jpg", "bad\x01.jpg", ""])
def test_unsafe_member_names_are_named(name):
    assert unsafe_name(name)


def test_a_plain_shard_scans_into_samples_with_offsets_that_point_at_the_image_bytes():
    data = _tar([("k1.jpg", b"JPEGDATA1"), ("k1.cls", b"3"), ("k2.png", b"PNG2"), ("k2.cls", b" 0\n"),
                 ("k2.txt", b"a caption, passed over")])
    scan = _scan(data, num_classes=4)
    assert not scan.problems and not scan.broken
    assert [(s.key, s.image_ext, s.label) for s in scan.samples] == [("k1", "jpg", 3), ("k2", "png", 0)]
    first, second = scan.samples
    assert data[first.offset:first.offset + first.size] == b"JPEGDATA1"
    assert data[second.offset:second.offset + second.size] == b"PNG2"


def test_multilabel_rows_come_from_json_members():
    scan = _scan(_tar([("a.jpg", b"x"), ("a.json", b"[0, 1, 1]"), ("b.jpg", b"y"), ("b.json", b'{"labels": [1,0,0]}')]),
                 multilabel=True, num_classes=3)
    assert [s.label for s in scan.samples] == [[0, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize(("members", "needle"), [
    ([("../evil.jpg", b"x"), ("../evil.cls", b"0")], "'..' part"),
    ([("/abs.jpg", b"x"), ("/abs.cls", b"0")], "absolute"),
    ([("k.jpg", b"x")], "no .cls label"),
    ([("k.cls", b"1")], "no image member"),
    ([("k.jpg", b"x"), ("k.cls", b"seven")], "class index"),
    ([("k.jpg", b"x"), ("k.cls", b"9")], "outside [0, 4)"),
    ([("k.jpg", b"x" * 2000), ("k.cls", b"1")], "larger than the bound"),
])
def test_a_bad_sample_is_a_problem_naming_it_and_the_good_ones_are_kept(members, needle):
    data = _tar([("good.jpg", b"g"), ("good.cls", b"1"), *members, ("last.png", b"l"), ("last.cls", b"2")])
    scan = _scan(data, num_classes=4, max_member_bytes=1000)
    assert [s.key for s in scan.samples] == ["good", "last"]
    assert len(scan.problems) == 1 and needle in str(scan.problems[0]), scan.problems
    assert scan.problems[0].offset > 0


def test_links_and_devices_are_never_followed():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo("k.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
        label = tarfile.TarInfo("k.cls")
        label.size = 1
        archive.addfile(label, io.BytesIO(b"0"))
    scan = _scan(buffer.getvalue())
    assert not scan.samples and "not a regular file" in str(scan.problems[0])


def test_a_truncated_shard_keeps_what_came_before_and_says_where_it_ends():
    data = _tar([("a.jpg", b"A" * 600), ("a.cls", b"0"), ("b.jpg", b"B" * 5000), ("b.cls", b"1")])
    cut = data[:data.index(b"B" * 100) + 100]
    scan = _scan(cut)
    assert scan.broken and [s.key for s in scan.samples] == ["a"]
    assert "truncated" in str(scan.problems[0]) and f"past the shard's end ({len(cut)} bytes)" in str(scan.problems[0])


def test_garbage_is_not_a_shard():
    scan = _scan(b"this is not a tar archive at all" * 40)
    assert scan.broken and not scan.samples and "tar" in str(scan.problems[0])


def test_a_header_that_does_not_parse_ends_the_scan_at_its_offset():
    data = bytearray(_tar([("a.jpg", b"A"), ("a.cls", b"0"), ("b.jpg", b"B"), ("b.cls", b"1")]))
    second_header = 2 * 2 * 512  # short ASCII names: a header and a data block a member, the third member
    data[second_header + 148:second_header + 156] = b"garbage!"  # the header checksum field
    scan = _scan(bytes(data))
    assert scan.broken and scan.problems[-1].offset == second_header


def test_labels_refuse_what_is_not_a_label():
    assert parse_label("cls", b" 12\n", None) == 12
    for bad in (b"-1", b"1.5", b"", b"one"):
        with pytest.raises(ValueError):
            parse_label("cls", bad, None)
    with pytest.raises(ValueError, match="multi-hot"):
        parse_label("json", b"[0, 2]", None)
    with pytest.raises(ValueError, match="for 3 classes"):
        parse_label("json", b"[0, 1]", 3)
