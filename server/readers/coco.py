"""COCO instances json -> Dataset, through pycocotools.

Runs in whichever process reads a dataset (the CLI, the daemon). Reads files only; it
allocates no shared memory, so every error here comes before a snapshot exists.

What the reader does with the json:

- Category ids are sorted ascending and renumbered 0..N-1 (the customary YOLO mapping);
  ``Dataset.names`` are their names in that order; more than ``max_classes`` (``--max-classes``),
  or names too long for a reply, are refused (``_common.check_class_names``).
- ``bbox`` [x, y, w, h] in pixels becomes normalised x1, y1, x2, y2 (divided by the image
  entry's ``width``/``height``) and is clipped to [0, 1]. Boxes with ``w <= 0`` or
  ``h <= 0`` (or nothing left after clipping) are dropped and counted in
  ``ReaderStats.degenerate_skipped``.
- Polygon segmentations are normalised the same way and clipped; an instance with several
  parts keeps the part with the most points, as the YOLO segment exports do (see
  ``_common.main_part``: on coco128 that is not always the largest by area). An RLE
  segmentation on a non-crowd annotation gives an empty (0, 2) polygon (the box is still kept).
- Crowd annotations (``iscrowd: 1``, stored as RLE) never become training boxes: they are
  left out and counted in ``ReaderStats.crowd_skipped`` (logged at debug level). The YOLO
  exports of COCO leave them out too, so both formats give the same instances.
- A ``bbox`` or polygon holding NaN or +-Infinity (which Python's json accepts) is refused,
  naming the annotation and its image, as the YOLO reader refuses non-finite numbers.
- Images without (kept) annotations are background records with 0 instances.
- Every image file must exist when the json is read (``MissingFileError`` otherwise).
- Records are sorted by image path, like the YOLO reader's, so the same images come in
  the same order whichever format they were read from.

Per task (``task``):

- detect: as above.
- segment: every kept annotation needs a polygon (Ultralytics refuses a segment dataset with
  boxes that have none): an RLE or missing segmentation on a non-crowd annotation is refused,
  naming it.
- pose: the keypoint names are the categories' ``keypoints`` lists (every category that has one
  must have the same; K = their length), and each kept annotation's ``keypoints`` is 3K numbers
  x, y, v in pixels (v 0 absent, 1 occluded, 2 visible), normalised like the box (not clipped,
  as the YOLO reader keeps them). ``flip_idx`` is derived from the names: a name whose ``left``
  word (``left_eye``, ``eye_left``, ``left-eye``) becomes ``right`` names its mirror, and the
  other way round; a name without either word is its own mirror. A left name without its right
  partner is refused. Polygons are not kept (a YOLO pose set has none either). kpt_shape is (K, 3).
- obb: refused: COCO has no oriented boxes.

Bounds, each refused by file and field before the value is used or printed:

- The file: at most ``max_json_bytes()`` bytes (``DEFAULT_MAX_JSON_BYTES``, 1 GiB, or
  ``PIXPOOL_MAX_JSON_BYTES``), read at most that far. COCO's largest, instances_train2017.json,
  is 448 MB; read as Python objects a json takes 5 to 9 times its size in memory, so the limit
  is what bounds the reader's memory (LVIS's 1.1 GB train json needs the variable raised).
- ``categories``: at most ``max_classes`` entries, counted while the list is decoded one entry
  at a time (``_decode``), so a json of millions of categories costs its text, not a dict per
  category (a 175 MB one took 1.47 GB when decoded whole).
- ids are integers (category ids) or integers and strings of at most ``MAX_ID_CHARS``
  (image and annotation ids); a category's ``keypoints`` at most ``MAX_KEYPOINTS`` names; a
  keypoint visibility 0..``MAX_VISIBILITY``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import sys
from pathlib import Path

import numpy as np

from ...shared.errors import ConfigError, DatasetError, MissingFileError
from ...shared.stream.config import DEFAULT_MAX_CLASSES, MAX_CLASSES
from ...shared.stream.records import Dataset, Record
from ...shared.task import DETECT, TaskSpec
from ...shared.text import human_bytes, shown
from ...shared.wire.trainer import MAX_KEYPOINTS
from ._common import ReaderStats, check_class_names, clip_unit, main_part, make_record
from .yolo_labels import MAX_VISIBILITY

logger = logging.getLogger(__name__)

_REQUIRED_TOP = ("images", "annotations", "categories")
_REQUIRED_IMAGE = ("id", "file_name", "width", "height")
_REQUIRED_ANN = ("id", "image_id", "category_id", "bbox")

#: Largest annotation file read (1 GiB) unless ``MAX_JSON_ENV`` names another number of bytes.
DEFAULT_MAX_JSON_BYTES = 1 << 30
MAX_JSON_ENV = "PIXPOOL_MAX_JSON_BYTES"
#: Longest image or annotation id written as a string (the messages print them).
MAX_ID_CHARS = 256
#: Longest ``file_name``: Linux's PATH_MAX.
MAX_FILE_NAME_CHARS = 4096
# JSON's whitespace, skipped between the values ``_decode`` reads itself.
_WS = re.compile(r"[ \t\n\r]*")


def max_json_bytes() -> int:
    """The largest annotation file read: ``MAX_JSON_ENV`` where set, else ``DEFAULT_MAX_JSON_BYTES``."""
    raw = os.environ.get(MAX_JSON_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_JSON_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(
            f"{MAX_JSON_ENV}={shown(raw, 40)} must be a positive whole number of bytes (the largest COCO json "
            f"read; default {DEFAULT_MAX_JSON_BYTES})",
            field=MAX_JSON_ENV,
            value=raw,
        )
    return value


def default_images_dir(json_path: Path) -> Path:
    """The images folder of the standard layout: root/annotations/instances_NAME.json -> root/images/NAME.

    Raises DatasetError telling the user to pass ``images=`` (``--images DIR``) when the
    json is not laid out that way or the folder does not exist.
    """
    stem = json_path.stem
    parent = json_path.parent
    if parent.name == "annotations" and stem.startswith("instances_") and len(stem) > len("instances_"):
        candidate = parent.parent / "images" / stem[len("instances_") :]
        if candidate.is_dir():
            return candidate
        hint = f"the standard layout would put them in {candidate}, which does not exist"
    else:
        hint = "it is not in the standard layout root/annotations/instances_NAME.json (images in root/images/NAME)"
    raise DatasetError(
        f"cannot tell where the images are: {hint}; pass the images folder (--images DIR, or images= in Python)",
        path=str(json_path),
    )


def _load_json(json_path: Path, max_classes: int) -> dict:
    limit = max_json_bytes()
    try:
        with open(json_path, "rb") as file:
            raw = file.read(limit + 1)  # never more than the limit: the file may be a pipe or /dev/zero
    except FileNotFoundError:
        raise MissingFileError("annotation file does not exist; check the path", path=str(json_path)) from None
    except OSError as exc:
        raise DatasetError(
            f"cannot read the annotation file ({exc.strerror}); check its permissions", path=str(json_path)
        ) from None
    if len(raw) > limit:
        raise DatasetError(
            f"over {limit} bytes ({human_bytes(limit)}), the limit on an annotation file (COCO's largest, "
            f"instances_train2017.json, is 448 MB; reading one takes 5 to 9 times its size in memory); set "
            f"{MAX_JSON_ENV} to a larger number of bytes to read it",
            path=str(json_path),
        )
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads decodes bytes
        del raw
        data = _decode(text, str(json_path), max_classes)
    except DatasetError:  # too many categories: a ValueError too, but said already
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"not a valid json file ({exc}); pass a COCO instances json", path=str(json_path)) from None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise DatasetError(
            f"not a valid json file ({shown(str(exc), 300)}); pass a COCO instances json", path=str(json_path)
        ) from None
    except RecursionError:
        # The json parser recurses once per level; a COCO file is 4 levels deep.
        raise DatasetError(
            f"nested deeper than the json parser's limit (about {sys.getrecursionlimit()} levels); "
            "a COCO instances json is a few levels deep: pass a COCO instances json",
            path=str(json_path),
        ) from None
    if not isinstance(data, dict):
        raise DatasetError(
            f"top level is a {type(data).__name__}, expected an object with keys {list(_REQUIRED_TOP)}",
            path=str(json_path),
        )
    missing = [k for k in _REQUIRED_TOP if not isinstance(data.get(k), list)]
    if missing:
        raise DatasetError(
            f"missing or non-list key(s) {missing}; a COCO instances json needs {list(_REQUIRED_TOP)}",
            path=str(json_path),
        )
    return data


def _decode(text: str, where: str, max_classes: int):
    """``json.loads(text)``, but a top-level object's ``categories`` list is decoded one entry at
    a time and refused past ``max_classes`` entries, before the next is made an object."""
    decoder = json.JSONDecoder()
    i = _WS.match(text).end()
    if not text.startswith("{", i):
        return decoder.decode(text)  # not an object: refused by the caller, or its parse error
    data = {}
    i = _WS.match(text, i + 1).end()
    if text.startswith("}", i):
        return decoder.decode(text)
    while True:
        if not text.startswith('"', i):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
        key, i = decoder.raw_decode(text, i)
        i = _WS.match(text, i).end()
        if not text.startswith(":", i):
            raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
        i = _WS.match(text, i + 1).end()
        if key == "categories" and text.startswith("[", i):
            data[key], i = _decode_categories(decoder, text, i, where, max_classes)
        else:
            data[key], i = decoder.raw_decode(text, i)
        i = _WS.match(text, i).end()
        if text.startswith("}", i):
            break
        if not text.startswith(",", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _WS.match(text, i + 1).end()
    i = _WS.match(text, i + 1).end()
    if i != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return data


def _decode_categories(decoder: json.JSONDecoder, text: str, i: int, where: str, max_classes: int) -> tuple[list, int]:
    """The list starting at ``text[i]`` ("[") and the index after it; DatasetError at its entry
    past ``max_classes``."""
    out: list = []
    i = _WS.match(text, i + 1).end()
    if text.startswith("]", i):
        return out, i + 1
    while True:
        if len(out) == max_classes:
            raise DatasetError(
                f"'categories' holds at least {max_classes + 1} classes, over the limit of {max_classes} (read no further); "
                f"check the class list, or raise --max-classes (up to {MAX_CLASSES}) if the dataset really has that many",
                path=where,
            )
        item, i = decoder.raw_decode(text, i)
        out.append(item)
        i = _WS.match(text, i).end()
        if text.startswith("]", i):
            return out, i + 1
        if not text.startswith(",", i):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _WS.match(text, i + 1).end()


def _finite(value: int | float) -> bool:
    """``math.isfinite``, False (not OverflowError) for an integer past float's range."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_id(value, *, strings: bool = True) -> bool:
    """Whether ``value`` is an id the reader can index and print: an int, or (``strings``) a
    string of at most ``MAX_ID_CHARS``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    return strings and isinstance(value, str) and len(value) <= MAX_ID_CHARS


def _validate(data: dict, json_path: Path) -> None:
    """Check every entry the reader relies on, so pycocotools' index never sees a bad one."""
    where = str(json_path)
    for i, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or "id" not in cat or "name" not in cat:
            raise DatasetError(f"categories[{i}] needs 'id' and 'name'", path=where)
        if not _is_id(cat["id"], strings=False):
            raise DatasetError(
                f"categories[{i}]: field 'id' is {shown(cat['id'], 60)}; category ids are integers", path=where
            )
        name = cat["name"]
        if isinstance(name, bool) or not isinstance(name, (str, int, float)):
            raise DatasetError(
                f"categories[{i}] (id {cat['id']}): field 'name' is {shown(name, 60)}; a class name is a string",
                path=where,
            )
    cat_ids = [c["id"] for c in data["categories"]]
    if len(set(cat_ids)) != len(cat_ids):
        raise DatasetError("duplicate category ids; each category needs its own id", path=where)
    image_ids = set()
    file_names: dict = {}
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or any(k not in img for k in _REQUIRED_IMAGE):
            raise DatasetError(f"images[{i}] needs keys {list(_REQUIRED_IMAGE)}", path=where)
        if not _is_id(img["id"]):
            raise DatasetError(
                f"images[{i}]: field 'id' is {shown(img['id'], 60)}; an image id is an integer "
                f"(or a string of at most {MAX_ID_CHARS} characters)",
                path=where,
            )
        w, h = img["width"], img["height"]
        if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0):
            raise DatasetError(
                f"images[{i}] (id {img['id']}): width/height must be positive integers, got {w!r}/{h!r}", path=where
            )
        if img["id"] in image_ids:
            raise DatasetError(f"images[{i}]: duplicate image id {img['id']}", path=where)
        _check_file_name(img["file_name"], i, img["id"], where)
        image_ids.add(img["id"])
        file_names[img["id"]] = img["file_name"]
    known_cats = set(cat_ids)
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or any(k not in ann for k in _REQUIRED_ANN):
            raise DatasetError(f"annotations[{i}] needs keys {list(_REQUIRED_ANN)}", path=where)
        for key in ("id", "image_id", "category_id"):
            if not _is_id(ann[key]):
                raise DatasetError(
                    f"annotations[{i}]: field {key!r} is {shown(ann[key], 60)}; ids are integers "
                    f"(or strings of at most {MAX_ID_CHARS} characters)",
                    path=where,
                )
        if ann["image_id"] not in image_ids:
            raise DatasetError(
                f"annotations[{i}] (id {ann['id']}) points at unknown image id {ann['image_id']!r}; add the image to 'images' or remove the annotation",
                path=where,
            )
        if ann["category_id"] not in known_cats:
            raise DatasetError(
                f"annotations[{i}] (id {ann['id']}) has unknown category id {ann['category_id']!r}; known ids are {shown(sorted(known_cats))}",
                path=where,
            )
        bbox = ann["bbox"]
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            raise DatasetError(
                f"annotations[{i}] (id {ann['id']}): bbox must be 4 numbers [x, y, w, h], got {shown(bbox)}", path=where
            )
        # Python's json reads NaN, Infinity and -Infinity; a box made of them would be stored
        # and trained on (NaN passes every comparison the reader makes as False).
        if not all(_finite(v) for v in bbox):
            image = f"image id {ann['image_id']}, {file_names[ann['image_id']]}"
            raise DatasetError(
                f"annotations[{i}] (id {ann['id']}, {image}): bbox holds a number that is not "
                f"finite, {bbox!r}; write the box as 4 finite pixel values [x, y, w, h] or remove "
                "the annotation",
                path=where,
            )


def _check_file_name(name, i: int, image_id, where: str) -> None:
    """A ``file_name`` must stay inside the images folder: relative, without ``..``. An
    annotation file is data, and data must not make the preparing process read (and serve)
    any file it can open (``../../home/x/.ssh/...``, ``/etc/...``)."""
    if not isinstance(name, str) or not name or len(name) > MAX_FILE_NAME_CHARS:
        raise DatasetError(
            f"images[{i}] (id {image_id}): field 'file_name' must be a non-empty string of at most "
            f"{MAX_FILE_NAME_CHARS} characters, got {shown(name, 200)}",
            path=where,
        )
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or os.path.isabs(name) or ".." in parts or "\0" in name:
        raise DatasetError(
            f"images[{i}] (id {image_id}): field 'file_name' {name!r} points outside the images folder; "
            "file names must be relative to it, without '..' (move the image into the folder, or pass --images)",
            path=where,
        )


def _index(data: dict):
    """A pycocotools COCO index over already-validated data (its progress prints silenced)."""
    from pycocotools.coco import COCO

    # pycocotools prints "creating index..." to stdout; the CLI's --json output must stay clean.
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = data
        coco.createIndex()
    return coco


def _polygon(segmentation, width: int, height: int, json_path: Path, ann_id) -> np.ndarray:
    if not isinstance(segmentation, list):  # RLE on a non-crowd annotation: no polygon
        return np.zeros((0, 2), dtype=np.float32)
    parts = []
    scale = np.array([width, height], dtype=np.float64)
    for part in segmentation:
        if not isinstance(part, list) or len(part) % 2:
            raise DatasetError(
                f"annotation id {ann_id}: each polygon must be a flat list of x, y pairs", path=str(json_path)
            )
        try:
            pts = np.asarray(part, dtype=np.float64).reshape(-1, 2)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past float's range
            raise DatasetError(f"annotation id {ann_id}: polygon holds non-numbers", path=str(json_path)) from None
        if not np.isfinite(pts).all():
            raise DatasetError(
                f"annotation id {ann_id}: polygon holds a number that is not finite (NaN or Infinity); "
                "write finite pixel coordinates or remove the segmentation",
                path=str(json_path),
            )
        parts.append(pts / scale)
    return clip_unit(main_part(parts))


_SIDES = {"left": "right", "right": "left"}


def _mirror_name(name: str) -> str:
    """``name`` with its ``left`` and ``right`` words swapped (words split at ``_``, ``-``, space)."""
    out, word = [], []
    for ch in name + "\0":
        if ch in "_- \0":
            text = "".join(word)
            out.append(_SIDES.get(text.lower(), text))
            word = []
            if ch != "\0":
                out.append(ch)
        else:
            word.append(ch)
    return "".join(out)


def flip_idx_from_names(names: list[str], where: str) -> tuple[int, ...]:
    """The keypoint each one becomes under a left-right flip, from the keypoint names
    (module docstring); DatasetError naming the keypoint that has no mirror."""
    lowered = [n.lower() for n in names]
    if len(set(lowered)) != len(lowered):
        raise DatasetError(
            f"the categories' keypoint names {shown(names)} repeat a name; each keypoint needs its own name to pair it "
            "with its mirror (left_* with right_*)",
            path=where,
        )
    index = {n: i for i, n in enumerate(lowered)}
    flip = []
    for i, name in enumerate(names):
        mirror = _mirror_name(name).lower()
        if mirror == lowered[i]:
            flip.append(i)
        elif mirror in index:
            flip.append(index[mirror])
        else:
            raise DatasetError(
                f"keypoint {i} {shown(name, 60)} has no mirror {shown(mirror, 60)} among the keypoint names {shown(names)}, so the flip pairs "
                "(flip_idx) cannot be derived: a name with a left or right word needs its partner. Rename the keypoints "
                "so every left_* has a right_*, or convert the set to YOLO pose labels with a data.yaml that states "
                "'flip_idx'",
                path=where,
            )
    return tuple(flip)


def _keypoint_names(data: dict, where: str) -> list[str]:
    """The one keypoint name list the categories share (module docstring, pose)."""
    lists = {}
    for i, cat in enumerate(data["categories"]):
        names = cat.get("keypoints")
        if names is None:
            continue
        if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise DatasetError(
                f"categories[{i}] (id {cat['id']}): 'keypoints' must be a non-empty list of keypoint names, got {shown(names)}",
                path=where,
            )
        if len(names) > MAX_KEYPOINTS:
            raise DatasetError(
                f"categories[{i}] (id {cat['id']}): 'keypoints' names {len(names)} keypoints, over the limit of "
                f"{MAX_KEYPOINTS} (what a trainer's attach carries); check the category",
                path=where,
            )
        lists[cat["id"]] = names
    if not lists:
        raise DatasetError(
            "no category has 'keypoints' (the keypoint names), so this json holds no pose dataset; the pose task "
            "needs a COCO keypoints json (person_keypoints_*.json), or pass the task the annotations are for (--task detect)",
            path=where,
        )
    first_id, first = next(iter(lists.items()))
    for cid, names in lists.items():
        if names != first:
            raise DatasetError(
                f"category id {cid} names keypoints {shown(names)}, category id {first_id} {shown(first)}: one pose dataset has one "
                "keypoint layout; give every category with keypoints the same list",
                path=where,
            )
    return first


def _ann_keypoints(ann: dict, k: int, width: int, height: int, where: str) -> np.ndarray:
    """(K, 3) normalised x, y and visibility of one annotation."""
    raw = ann.get("keypoints")
    image = f"annotation id {ann['id']} (image id {ann['image_id']})"
    if not (isinstance(raw, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)):
        raise DatasetError(
            f"{image}: 'keypoints' must be a list of {3 * k} numbers (x, y, v for each of the {k} keypoints the "
            f"categories name), got {'nothing' if raw is None else type(raw).__name__}; add them, or pass --task detect",
            path=where,
        )
    if len(raw) != 3 * k:
        raise DatasetError(
            f"{image}: 'keypoints' holds {len(raw)} numbers, expected {3 * k} (x, y, v for each of the {k} keypoints "
            "the categories name); fix the annotation or the category's keypoint names",
            path=where,
        )
    try:
        pts = np.asarray(raw, dtype=np.float64).reshape(k, 3)
    except OverflowError:  # an integer past float's range: not finite either
        pts = np.full((k, 3), np.inf)
    if not np.isfinite(pts).all() or (pts[:, 2] < 0).any() or (pts[:, 2] > MAX_VISIBILITY).any():
        raise DatasetError(
            f"{image}: 'keypoints' holds a number that is not finite or a negative visibility or one over "
            f"{MAX_VISIBILITY:g}; write finite pixel coordinates and visibility 0 (absent), 1 (occluded) or 2 (visible)",
            path=where,
        )
    return pts / np.array([width, height, 1.0])


def read_coco(
    json_path: str | os.PathLike,
    images: str | os.PathLike | None = None,
    *,
    task: TaskSpec = DETECT,
    max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[Dataset, ReaderStats]:
    """Read a COCO instances json for ``task``; ``images`` is the folder ``file_name`` is relative to.
    More than ``max_classes`` categories (``--max-classes``) are refused.

    Returns the Dataset and what was left out (see the module docstring for the rules).
    Raises DatasetError (MissingFileError for absent files) naming the file.
    """
    spec = task
    json_path = Path(os.path.abspath(json_path))
    if spec.rotated:
        raise DatasetError(
            "the obb task needs oriented boxes, which a COCO json has no field for; write YOLO OBB labels "
            "('cls x1 y1 x2 y2 x3 y3 x4 y4', the 4 corners normalised) with a data.yaml, or pass --task detect",
            path=str(json_path),
        )
    data = _load_json(json_path, max_classes)
    images_dir = Path(os.path.abspath(images)) if images is not None else default_images_dir(json_path)
    if not images_dir.is_dir():
        raise MissingFileError(
            f"images folder {images_dir} (for {json_path}) does not exist; pass the folder holding the images",
            path=str(images_dir),
        )
    _validate(data, json_path)
    coco = _index(data)

    cat_ids = sorted(coco.getCatIds())
    cat_index = {cid: i for i, cid in enumerate(cat_ids)}
    names = tuple(str(coco.cats[cid]["name"]) for cid in cat_ids)
    where = str(json_path)
    check_class_names(names, max_classes=max_classes, path=where, what="the json's categories")
    kpt_names = _keypoint_names(data, where) if spec.has_keypoints else None
    k = len(kpt_names) if kpt_names is not None else 0
    flip_idx = flip_idx_from_names(kpt_names, where) if kpt_names is not None else None

    crowd = degenerate = 0
    records: list[Record] = []
    for img_id in coco.getImgIds():
        img = coco.imgs[img_id]
        path = images_dir / img["file_name"]
        if not path.is_file():
            raise MissingFileError(
                f"image file does not exist (image id {img_id}, listed in {json_path}); add the file or remove the image entry",
                path=str(path),
            )
        w, h = img["width"], img["height"]
        classes, boxes, polygons = [], [], []
        keypoints = [] if spec.has_keypoints else None
        for ann in coco.imgToAnns.get(img_id, ()):
            if ann.get("iscrowd", 0):
                crowd += 1
                continue
            x, y, bw, bh = (float(v) for v in ann["bbox"])
            if bw <= 0 or bh <= 0:
                degenerate += 1
                continue
            box = clip_unit(np.array([x / w, y / h, (x + bw) / w, (y + bh) / h], dtype=np.float64))
            if box[2] <= box[0] or box[3] <= box[1]:
                degenerate += 1
                continue
            if spec.has_keypoints:
                keypoints.append(_ann_keypoints(ann, k, w, h, where))
                polygon = np.zeros((0, 2), dtype=np.float32)
            else:
                polygon = _polygon(ann.get("segmentation"), w, h, json_path, ann["id"])
                if spec.has_masks and not len(polygon):
                    raise DatasetError(
                        f"annotation id {ann['id']} (image id {img_id}, {img['file_name']}) has no polygon of 3 or more "
                        "points (an RLE or empty segmentation): the segment task needs one for every instance, as "
                        "Ultralytics' does; write it as a polygon, remove the annotation, or pass --task detect",
                        path=where,
                    )
            classes.append(cat_index[ann["category_id"]])
            boxes.append(box)
            polygons.append(polygon)
        records.append(make_record(str(path), (int(h), int(w)), classes, boxes, polygons, keypoints, kpt_count=k))

    records.sort(key=lambda r: r.image_path)
    stats = ReaderStats(
        records=len(records),
        instances=sum(r.num_instances for r in records),
        background=sum(1 for r in records if r.num_instances == 0),
        crowd_skipped=crowd,
        degenerate_skipped=degenerate,
    )
    logger.debug("%s: %s", json_path, stats)
    dataset = Dataset(
        records=tuple(records),
        names=names,
        source_files=(str(json_path),),
        spec=spec.with_keypoints((k, 3) if spec.has_keypoints else None, flip_idx),
    )
    return dataset, stats
