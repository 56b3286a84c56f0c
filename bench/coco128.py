"""bench/coco128.py: build the coco128 folder the tests and benchmarks read, from two public downloads.

The inputs (this script reads local files only; ``--urls`` prints where to get them):

- the images: Ultralytics' ``coco128.zip`` (``coco128/images/train2017/*.jpg`` and its YOLO detect
  labels ``coco128/labels/train2017/*.txt``), that zip extracted (the folder holding
  ``images/``), or a plain folder of COCO train2017 ``*.jpg`` files;
- the annotations: COCO's full ``instances_train2017.json``, or ``annotations_trainval2017.zip``
  that holds it (the script loads the whole json: about 450 MB of text).

Written under OUT (absent or empty; everything goes to a temporary folder beside it, renamed
to OUT at the end, so a failed run leaves nothing)::

    images/train2017/*.jpg               the images, as given
    labels/train2017/*.txt               YOLO detect labels: the zip's files as they are; from the
                                         json where the images came without labels (see below)
    annotations/instances_train2017.json COCO's json filtered to these images: info, licenses, all
                                         categories, their image entries (by id), their
                                         annotations (crowd RLE included, in the json's order)
    labels-seg/train2017/*.txt           YOLO segment labels from the json's polygons

Segment labels, one file per image (empty when it has no polygon): one line per non-crowd
annotation, in the json's order: ``cls x1 y1 x2 y2 ...`` with ``cls`` the category's position
among the sorted category ids (0-79), the coordinates divided by the image's width and height,
six decimals. An instance with several polygons keeps the one with the most points (the first
of equals), as the readers' ``main_part`` does.

Detect labels derived from the json follow Ultralytics' coco128 files: non-crowd annotations with
a positive box, ``cls cx cy w h`` normalised, ``%g``, repeated lines once, no file for an image
without one.

    python bench/coco128.py OUT --images coco128.zip --annotations annotations_trainval2017.zip
    python bench/coco128.py --urls

Tests and benchmarks read ``../shared/data/coco128`` beside the checkout, or the folder
``PIXPOOL_COCO128`` names.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

IMAGES_URL = "https://github.com/ultralytics/assets/releases/download/v0.0.0/coco128.zip"
ANNOTATIONS_URL = "http://images.cocodataset.org/annotations/annotations_trainval2017.zip"
JSON_MEMBER = "annotations/instances_train2017.json"
SPLIT = "train2017"


class BuildError(Exception):
    """An input that cannot give coco128; the message names the file and what to do."""


# -- inputs --------------------------------------------------------------------------------------
def read_images(source: Path) -> tuple[dict[str, Callable[[], bytes]], dict[str, Callable[[], bytes]] | None]:
    """(images, labels) of ``source``: file name -> a reader of its bytes. ``labels`` is None where
    the images come without YOLO labels (a plain folder of ``*.jpg``)."""
    if not source.exists():
        raise BuildError(f"{source} does not exist: pass Ultralytics' coco128.zip ({IMAGES_URL}) or a folder of *.jpg")
    if source.is_file():
        return _read_zip(source)
    if (source / "images" / SPLIT).is_dir():  # the zip extracted
        images = _read_folder(source / "images" / SPLIT, "*.jpg")
        labels = source / "labels" / SPLIT
        return images, _read_folder(labels, "*.txt") if labels.is_dir() else None
    images = _read_folder(source, "*.jpg")
    if not images:
        raise BuildError(f"{source} holds no *.jpg (nor images/{SPLIT}/): pass coco128.zip or a folder of COCO images")
    return images, None


def _read_folder(folder: Path, pattern: str) -> dict[str, Callable[[], bytes]]:
    return {p.name: p.read_bytes for p in sorted(folder.glob(pattern)) if p.is_file()}


def _read_zip(path: Path) -> tuple[dict[str, Callable[[], bytes]], dict[str, Callable[[], bytes]]]:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise BuildError(f"{path} is not a zip file ({e}): download coco128.zip again from {IMAGES_URL}") from None
    images: dict[str, Callable[[], bytes]] = {}
    labels: dict[str, Callable[[], bytes]] = {}
    for member in archive.namelist():
        parts = member.split("/")
        if len(parts) < 3 or parts[-2] != SPLIT or "__MACOSX" in parts or parts[-1].startswith("._"):
            continue  # macOS archivers add resource forks under __MACOSX/ and ._NAME
        kind, name = parts[-3], parts[-1]
        if kind == "images" and name.endswith(".jpg"):
            images[name] = lambda m=member: archive.read(m)
        elif kind == "labels" and name.endswith(".txt"):
            labels[name] = lambda m=member: archive.read(m)
    if not images:
        raise BuildError(
            f"{path} holds no images/{SPLIT}/*.jpg: expected Ultralytics' coco128.zip "
            f"(coco128/images/{SPLIT}/...), from {IMAGES_URL}"
        )
    return dict(sorted(images.items())), dict(sorted(labels.items()))


def read_annotations(path: Path) -> dict:
    """COCO's instances json, from the file or from ``annotations_trainval2017.zip``."""
    if not path.is_file():
        raise BuildError(f"{path} does not exist: pass instances_train2017.json or {ANNOTATIONS_URL.rsplit('/', 1)[1]}")
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if JSON_MEMBER not in archive.namelist():
                    raise BuildError(f"{path} holds no {JSON_MEMBER}: expected COCO's {ANNOTATIONS_URL}")
                with archive.open(JSON_MEMBER) as f:
                    data = json.load(io.TextIOWrapper(f, encoding="utf-8"))
        else:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BuildError(f"{path} is not valid json ({e}): download {ANNOTATIONS_URL} again") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    ):
        raise BuildError(f"{path} is not a COCO instances json (no images, annotations and categories lists)")
    if len(data["categories"]) != 80:
        raise BuildError(
            f"{path} has {len(data['categories'])} categories, not COCO's 80: pass instances_train2017.json "
            "(not person_keypoints or a panoptic json)"
        )
    return data


# -- derived files -------------------------------------------------------------------------------
def filter_json(data: dict, names: list[str], source: str) -> dict:
    """``data`` cut down to the images named ``names``: their entries sorted by id, their annotations
    in the json's order, every category, info and licenses."""
    wanted = set(names)
    entries = [img for img in data["images"] if img.get("file_name") in wanted]
    missing = sorted(wanted - {img["file_name"] for img in entries})
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise BuildError(
            f"{source} has no entry for {', '.join(missing[:3])}{more} ({len(missing)} of {len(names)} images): "
            f"pass COCO's instances_train2017.json (val2017 and test images are not in it)"
        )
    entries.sort(key=lambda img: img["id"])
    ids = {img["id"] for img in entries}
    return {
        "info": data.get("info", {}),
        "licenses": data.get("licenses", []),
        "categories": data["categories"],
        "images": entries,
        "annotations": [a for a in data["annotations"] if a["image_id"] in ids],
    }


def class_ids(data: dict) -> dict[int, int]:
    """COCO category id -> YOLO class: its position among the sorted ids."""
    return {cid: i for i, cid in enumerate(sorted(c["id"] for c in data["categories"]))}


def segment_labels(data: dict) -> dict[str, str]:
    """Image file name -> its YOLO segment label text (every image, empty without a polygon)."""
    cls = class_ids(data)
    lines: dict[int, list[str]] = {img["id"]: [] for img in data["images"]}
    sizes = {img["id"]: (img["width"], img["height"]) for img in data["images"]}
    for a in data["annotations"]:
        polygons = a["segmentation"]
        if a.get("iscrowd") or not isinstance(polygons, list) or not polygons:
            continue
        w, h = sizes[a["image_id"]]
        best = max(polygons, key=len)  # max keeps the first of equals
        xy = " ".join(f"{v / (w if i % 2 == 0 else h):.6f}" for i, v in enumerate(best))
        lines[a["image_id"]].append(f"{cls[a['category_id']]} {xy}\n")
    return {img["file_name"].rsplit(".", 1)[0] + ".txt": "".join(lines[img["id"]]) for img in data["images"]}


def detect_labels(data: dict) -> dict[str, str]:
    """Image file name -> its YOLO detect label text, only for images with a box."""
    cls = class_ids(data)
    lines: dict[int, list[str]] = {img["id"]: [] for img in data["images"]}
    sizes = {img["id"]: (img["width"], img["height"]) for img in data["images"]}
    for a in data["annotations"]:
        x, y, bw, bh = a["bbox"]
        if a.get("iscrowd") or bw <= 0 or bh <= 0:
            continue
        w, h = sizes[a["image_id"]]
        box = ((x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h)
        line = " ".join([str(cls[a["category_id"]]), *(f"{v:g}" for v in box)]) + "\n"
        if line not in lines[a["image_id"]]:
            lines[a["image_id"]].append(line)
    return {img["file_name"].rsplit(".", 1)[0] + ".txt": "".join(lines[img["id"]]) for img in data["images"] if lines[img["id"]]}  # fmt: skip


# -- the build -----------------------------------------------------------------------------------
def build(out: Path, images_source: Path, annotations: Path) -> dict:
    """Write coco128 under ``out`` (see the module's docstring); returns counts for the report."""
    out = out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BuildError(f"{out} exists and is not an empty folder: remove it or pick another OUT")
    images, labels = read_images(images_source)
    for name, read in images.items():
        if read()[:2] != b"\xff\xd8":
            raise BuildError(f"{images_source}: {name} is not a JPEG file: download coco128.zip again ({IMAGES_URL})")
    data = filter_json(read_annotations(annotations), list(images), str(annotations))
    detect = {name: read() for name, read in labels.items()} if labels is not None else detect_labels(data)
    segment = segment_labels(data)
    files = {
        **{f"images/{SPLIT}/{name}": read for name, read in images.items()},
        **{f"labels/{SPLIT}/{name}": text for name, text in detect.items()},
        **{f"labels-seg/{SPLIT}/{name}": text for name, text in segment.items()},
        f"annotations/instances_{SPLIT}.json": json.dumps(data),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for sub in ("images", "labels", "labels-seg"):  # each folder, even where it holds no file
            (tmp / sub / SPLIT).mkdir(parents=True)
        for rel, content in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if callable(content):
                content = content()
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the folder from other users
        os.rename(tmp, out)  # replaces an empty OUT; fails if one appeared meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "out": str(out),
        "images": len(images),
        "labels": len(detect),
        "labels_from": "json" if labels is None else str(images_source),
        "annotations": len(data["annotations"]),
        "segment_lines": sum(text.count("\n") for text in segment.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", type=Path, help="the folder to write (absent or empty)")
    p.add_argument("--images", type=Path, help="coco128.zip, that zip extracted, or a folder of train2017 *.jpg")
    p.add_argument("--annotations", type=Path, help="instances_train2017.json or annotations_trainval2017.zip")
    p.add_argument("--urls", action="store_true", help="print the two downloads and exit")
    args = p.parse_args(argv)
    if args.urls:
        print(f"images:      {IMAGES_URL}")
        print(f"annotations: {ANNOTATIONS_URL}")
        print("then: python bench/coco128.py OUT --images coco128.zip --annotations annotations_trainval2017.zip")
        return 0
    if args.out is None or args.images is None or args.annotations is None:
        p.error("OUT, --images and --annotations are needed (--urls prints where to download them)")
    try:
        report = build(args.out, args.images, args.annotations)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
