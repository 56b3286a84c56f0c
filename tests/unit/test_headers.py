"""``server/snapshot/headers.py``: a JPEG's size from its frame header agrees with Pillow's, EXIF
orientation included, and every file it does not fully understand is left to Pillow (None)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from pixpool.server.snapshot import prepare
from pixpool.server.snapshot.headers import header_sizes, jpeg_size_hw


def _jpeg(path, size=(40, 30), orientation: int | None = None, **save) -> str:
    im = Image.new("RGB", size, (10, 200, 30))
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    im.save(path, "JPEG", **save)
    return str(path)


def _pillow_hw(path) -> tuple[int, int]:
    with Image.open(path) as im:
        w, h = im.size
        o = im.getexif().get(0x0112, 1)
    return (w, h) if o in (5, 6, 7, 8) else (h, w)


@pytest.mark.parametrize("orientation", [None, 1, 3, 5, 6, 7, 8])
@pytest.mark.parametrize("progressive", [False, True])
def test_a_plain_jpeg_is_read_from_its_header_as_pillow_reads_it(tmp_path, orientation, progressive):
    path = _jpeg(tmp_path / "a.jpg", orientation=orientation, progressive=progressive)
    assert jpeg_size_hw(path) == _pillow_hw(path)
    assert prepare.header_size_hw(path) == _pillow_hw(path)


def test_what_pillow_must_decide_is_left_to_it(tmp_path):
    whole = _jpeg(tmp_path / "whole.jpg", size=(64, 48))
    data = open(whole, "rb").read()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[:-40])  # no end-of-image marker: Pillow's path refuses it by name
    assert jpeg_size_hw(str(cut)) is None
    with pytest.raises(Exception, match="end-of-image"):
        prepare.header_size_hw(str(cut))
    # An XMP segment (Pillow reads an orientation there too) right after SOI.
    xmp = b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta tiff:Orientation=\"6\"/>"
    seg = b"\xff\xe1" + (len(xmp) + 2).to_bytes(2, "big") + xmp
    with_xmp = tmp_path / "xmp.jpg"
    with_xmp.write_bytes(data[:2] + seg + data[2:])
    assert jpeg_size_hw(str(with_xmp)) is None
    assert prepare.header_size_hw(str(with_xmp)) == _pillow_hw(with_xmp) == (64, 48)
    png = tmp_path / "a.png"
    Image.new("RGB", (7, 5)).save(png)
    assert jpeg_size_hw(str(png)) is None and prepare.header_size_hw(str(png)) == (5, 7)
    assert jpeg_size_hw(str(tmp_path / "missing.jpg")) is None


def test_an_exif_segment_past_the_first_chunk_is_read(tmp_path):
    # A large APP13 block before the EXIF: the walk reads on past its first 4 KiB.
    buf = io.BytesIO()
    _jpeg(buf, size=(50, 20), orientation=6)
    data = buf.getvalue()
    block = b"Photoshop 3.0\x00" + bytes(20_000)
    seg = b"\xff\xed" + (len(block) + 2).to_bytes(2, "big") + block
    path = tmp_path / "big.jpg"
    path.write_bytes(data[:2] + seg + data[2:])
    assert jpeg_size_hw(str(path)) == _pillow_hw(path) == (50, 20)
    assert header_sizes([str(path)] * 3) == [(50, 20)] * 3
