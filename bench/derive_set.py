"""bench/derive_set.py: a detection set at scale, derived deterministically from coco128.

Runs in one process (the writer) and ``--processes`` spawned workers that each derive, encode and
write whole images; the writer collects their labels in image order and writes the label files
and jsons. Every image's randomness comes from (seed, split, index) alone, so the bytes do not
depend on the worker count or which worker took which image: two runs with the same flags give
byte-identical trees.

Each derived image is a distinct photograph made from one coco128 image (image ``i`` of a split
takes that split's source ``i mod sources``):

- a random crop: 35-100 % of the source's area, its aspect ratio the source's times 3/4 to 4/3;
- scaled so its long side is 640 (``--long-side``), COCO's size, with bilinear interpolation;
- flipped left-right with probability 1/2;
- re-encoded as JPEG at a random quality 80-95.

The splits take different sources, so no val image shares a photograph with a train image:
val uses coco128's images at positions 7, 15, 23, ... (16 of them, one in eight, in file order),
train the other 112.

Labels follow the image (from coco128's COCO json, its 929 non-crowd annotations):

- an annotation's polygon parts are clipped to the crop (Sutherland-Hodgman); parts with fewer
  than 3 points left are dropped, and the box is the clipped parts' bounding box (the visible
  extent of the object); an annotation without a polygon has its box clipped instead;
- an instance is dropped when its box keeps under 20 % of the area of its original box
  (``MIN_VISIBLE``), or is under 2 pixels wide or high in the derived image (``MIN_SIDE_PX``);
- crowd annotations (RLE) are left out, as coco128's YOLO labels leave them out.

Written under OUT (which must be empty or absent)::

    images/{train,val}/{split}_NNNNNN.jpg
    labels/{train,val}/{split}_NNNNNN.txt     YOLO detect: class cx cy w h, normalised (empty: background)
    annotations/instances_{train,val}.json    COCO instances: boxes and clipped polygons in pixels
    data.yaml                                 train/val folders (relative to it) and the 80 names

Serve it with ``pixpool serve OUT/data.yaml``, or as COCO with
``pixpool serve OUT/annotations/instances_train.json --images OUT/images/train``.

    python bench/derive_set.py OUT [--train 2000] [--val 200] [--seed 0] [--processes 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COCO128  # noqa: E402

LONG_SIDE = 640
AREA = (0.35, 1.0)  # of the source image's area
ASPECT = (3 / 4, 4 / 3)  # times the source's aspect ratio
QUALITY = (80, 95)  # JPEG quality, inclusive
MIN_VISIBLE = 0.2  # of an instance's original box area, kept inside the crop
MIN_SIDE_PX = 2.0  # of its box in the derived image
VAL_EVERY = 8  # one coco128 image in VAL_EVERY (the last of each eight) is a val source
SPLIT_CODES = {"train": 0, "val": 1}


# -- sources ---------------------------------------------------------------------------------------------
def load_sources(coco128: Path) -> tuple[list[dict], list[dict]]:
    """(sources, categories): each source is {path, width, height, anns: [(category_id, bbox, polygons)]}
    in file-name order; categories as in coco128's json."""
    json_path = coco128 / "annotations" / "instances_train2017.json"
    if not json_path.is_file():
        raise SystemExit(f"{json_path} not found: pass --coco128 DIR (a folder with images/ and annotations/)")
    data = json.loads(json_path.read_text())
    anns: dict[int, list] = {}
    for ann in data["annotations"]:
        if ann.get("iscrowd", 0):
            continue  # RLE crowd regions: no training box (module docstring)
        seg = ann.get("segmentation")
        polygons = [np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in seg] if isinstance(seg, list) else []
        anns.setdefault(ann["image_id"], []).append((ann["category_id"], [float(v) for v in ann["bbox"]], polygons))
    images = sorted(data["images"], key=lambda im: im["file_name"])
    sources = [
        {
            "path": str(coco128 / "images" / "train2017" / im["file_name"]),
            "width": int(im["width"]),
            "height": int(im["height"]),
            "anns": anns.get(im["id"], []),
        }
        for im in images
    ]
    return sources, sorted(data["categories"], key=lambda c: c["id"])


def split_sources(sources: list, split: str) -> list:
    """The sources of ``split``: val one in ``VAL_EVERY`` (module docstring), train the rest."""
    val = [i % VAL_EVERY == VAL_EVERY - 1 for i in range(len(sources))]
    return [s for s, v in zip(sources, val) if v == (split == "val")]


# -- geometry --------------------------------------------------------------------------------------------
def draw_params(rng: np.random.Generator, width: int, height: int, long_side: int) -> dict:
    """The crop (x0, y0, cw, ch), the derived size, the flip and the JPEG quality of one image."""
    area = rng.uniform(*AREA) * width * height
    aspect = (width / height) * math.exp(rng.uniform(math.log(ASPECT[0]), math.log(ASPECT[1])))
    cw = int(min(width, max(16, round(math.sqrt(area * aspect)))))
    ch = int(min(height, max(16, round(math.sqrt(area / aspect)))))
    x0 = int(rng.integers(0, width - cw + 1))
    y0 = int(rng.integers(0, height - ch + 1))
    s = long_side / max(cw, ch)
    out_w, out_h = max(1, round(cw * s)), max(1, round(ch * s))
    flip = bool(rng.random() < 0.5)
    quality = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
    return {"crop": (x0, y0, cw, ch), "size": (out_w, out_h), "flip": flip, "quality": quality}


def clip_polygon(points: np.ndarray, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    """``points`` (k, 2) clipped to the rectangle [x0, x1] x [y0, y1] (Sutherland-Hodgman)."""
    out = [tuple(p) for p in points]
    for axis, bound, keep_above in ((0, x0, True), (0, x1, False), (1, y0, True), (1, y1, False)):
        if not out:
            break
        src, out = out, []
        for j, cur in enumerate(src):
            prev = src[j - 1]
            cur_in = cur[axis] >= bound if keep_above else cur[axis] <= bound
            prev_in = prev[axis] >= bound if keep_above else prev[axis] <= bound
            if cur_in != prev_in:  # the edge crosses the bound: add the crossing point
                t = (bound - prev[axis]) / (cur[axis] - prev[axis])
                cross = [prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])]
                cross[axis] = bound
                out.append(tuple(cross))
            if cur_in:
                out.append(cur)
    return np.asarray(out, dtype=np.float64).reshape(-1, 2)


def transform_labels(anns: list, params: dict) -> list[tuple[int, list[float], list[np.ndarray]]]:
    """(category_id, box [x, y, w, h], polygons) of the instances kept in the derived image, in pixels
    of the derived image (module docstring's rules), in the source's annotation order."""
    x0, y0, cw, ch = params["crop"]
    out_w, out_h = params["size"]
    sx, sy = out_w / cw, out_h / ch

    def to_out(p: np.ndarray) -> np.ndarray:
        q = np.empty_like(p)
        q[:, 0] = (p[:, 0] - x0) * sx
        q[:, 1] = (p[:, 1] - y0) * sy
        if params["flip"]:
            q[:, 0] = out_w - q[:, 0]
        return q

    kept = []
    for category, (bx, by, bw, bh), polygons in anns:
        if bw <= 0 or bh <= 0:
            continue
        if polygons:
            parts = [c for c in (clip_polygon(p, x0, y0, x0 + cw, y0 + ch) for p in polygons) if len(c) >= 3]
            if not parts:
                continue
            allp = np.concatenate(parts)
            lo, hi = allp.min(axis=0), allp.max(axis=0)
        else:
            parts = []
            lo = np.array([max(bx, x0), max(by, y0)])
            hi = np.array([min(bx + bw, x0 + cw), min(by + bh, y0 + ch)])
        vis_w, vis_h = hi - lo
        if vis_w <= 0 or vis_h <= 0 or vis_w * vis_h < MIN_VISIBLE * bw * bh:
            continue
        corners = to_out(np.array([lo, hi]))
        left, right = sorted(corners[:, 0])
        top, bottom = corners[0, 1], corners[1, 1]
        if right - left < MIN_SIDE_PX or bottom - top < MIN_SIDE_PX:
            continue
        kept.append((category, [left, top, right - left, bottom - top], [to_out(p) for p in parts]))
    return kept


# -- one image (in a worker) -----------------------------------------------------------------------------
_STATE: dict = {}


def _init(sources: dict, seed: int, long_side: int, out: str) -> None:
    import cv2

    cv2.setNumThreads(1)  # one image per process; the pool is the parallelism
    _STATE.update(sources=sources, seed=seed, long_side=long_side, out=Path(out))


def derive_one(job: tuple[str, int]) -> tuple[str, int, str, tuple[int, int], list]:
    """Derive image ``index`` of ``split``, write it; (split, index, sha256, (w, h), instances)."""
    import cv2

    split, index = job
    sources = _STATE["sources"][split]
    src = sources[index % len(sources)]
    rng = np.random.default_rng([_STATE["seed"], SPLIT_CODES[split], index])
    image = cv2.imread(src["path"], cv2.IMREAD_COLOR)
    if image is None:
        raise SystemExit(f"{src['path']}: cannot decode the coco128 image")
    height, width = image.shape[:2]
    if (width, height) != (src["width"], src["height"]):
        raise SystemExit(f"{src['path']}: {width}x{height}, the json says {src['width']}x{src['height']}")
    params = draw_params(rng, width, height, _STATE["long_side"])
    x0, y0, cw, ch = params["crop"]
    crop = cv2.resize(image[y0 : y0 + ch, x0 : x0 + cw], params["size"], interpolation=cv2.INTER_LINEAR)
    if params["flip"]:
        crop = crop[:, ::-1]
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(crop), [cv2.IMWRITE_JPEG_QUALITY, params["quality"]])
    if not ok:
        raise SystemExit(f"cannot encode image {index} of {split}")
    data = encoded.tobytes()
    (_STATE["out"] / "images" / split / f"{split}_{index:06d}.jpg").write_bytes(data)
    return split, index, hashlib.sha256(data).hexdigest(), params["size"], transform_labels(src["anns"], params)


# -- the set ---------------------------------------------------------------------------------------------
def _yolo_lines(instances: list, size: tuple[int, int], class_of: dict[int, int]) -> str:
    w, h = size
    lines = []
    for category, (x, y, bw, bh), _ in instances:
        cx, cy = (x + bw / 2) / w, (y + bh / 2) / h
        lines.append(f"{class_of[category]} {cx:.6f} {cy:.6f} {bw / w:.6f} {bh / h:.6f}\n")
    return "".join(lines)


def _coco_json(split: str, results: list, categories: list) -> str:
    images, annotations = [], []
    for index, (_, size, instances) in enumerate(results):
        image_id = index + 1
        images.append({"id": image_id, "file_name": f"{split}_{index:06d}.jpg", "width": size[0], "height": size[1]})
        for category, box, polygons in instances:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category,
                    "bbox": [round(v, 2) for v in box],
                    "area": round(box[2] * box[3], 2),
                    "iscrowd": 0,
                    "segmentation": [[round(float(v), 2) for v in p.reshape(-1)] for p in polygons],
                }
            )
    return json.dumps({"images": images, "annotations": annotations, "categories": categories}, separators=(",", ":"))


def derive_set(
    out: Path,
    *,
    train: int = 2000,
    val: int = 200,
    seed: int = 0,
    processes: int = 2,
    coco128: Path = COCO128,
    long_side: int = LONG_SIDE,
) -> dict:
    """Write the set (module docstring) under ``out``; returns a summary (records, instances, seconds)."""
    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty; name a new folder (the set is written whole, never over another)")
    all_sources, categories = load_sources(coco128)
    sources = {split: split_sources(all_sources, split) for split in SPLIT_CODES}
    counts = {"train": train, "val": val}
    for split in SPLIT_CODES:
        (out / "images" / split).mkdir(parents=True)
        (out / "labels" / split).mkdir(parents=True)
    (out / "annotations").mkdir()
    jobs = [(split, i) for split in SPLIT_CODES for i in range(counts[split])]
    results: dict[str, list] = {split: [None] * counts[split] for split in SPLIT_CODES}
    args = (sources, seed, long_side, str(out))
    if processes > 1:
        with mp.get_context("spawn").Pool(processes, initializer=_init, initargs=args) as pool:
            done = list(pool.imap(derive_one, jobs, chunksize=16))
    else:
        _init(*args)
        done = [derive_one(job) for job in jobs]
    seen: dict[str, tuple[str, int]] = {}
    for split, index, digest, size, instances in done:
        if digest in seen:  # never expected: the crops are drawn from continuous ranges
            raise SystemExit(f"image {index} of {split} has the same bytes as image {seen[digest]}; change --seed")
        seen[digest] = (split, index)
        results[split][index] = (digest, size, instances)
    class_of = {c["id"]: k for k, c in enumerate(categories)}
    for split in SPLIT_CODES:
        for index, (_, size, instances) in enumerate(results[split]):
            (out / "labels" / split / f"{split}_{index:06d}.txt").write_text(_yolo_lines(instances, size, class_of))
        (out / "annotations" / f"instances_{split}.json").write_text(_coco_json(split, results[split], categories))
    names = "".join(f"  {k}: {c['name']}\n" for k, c in enumerate(categories))
    (out / "data.yaml").write_text(f"train: images/train\nval: images/val\nnames:\n{names}")
    return {
        "train": train,
        "val": val,
        "instances": {s: sum(len(r[2]) for r in results[s]) for s in SPLIT_CODES},
        "seconds": round(time.perf_counter() - t0, 2),
        "processes": processes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write the set in (new or empty)")
    parser.add_argument("--train", type=int, default=2000, help="training images (default 2000)")
    parser.add_argument("--val", type=int, default=200, help="validation images (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--long-side", type=int, default=LONG_SIDE, help="long side of every image (default 640)")
    parser.add_argument("--coco128", type=Path, default=COCO128, help=f"coco128 folder (default {COCO128})")
    args = parser.parse_args(argv)
    if args.train < 1 or args.val < 0 or args.processes < 1 or args.long_side < 16:
        parser.error("--train >= 1, --val >= 0, --processes >= 1 and --long-side >= 16")
    summary = derive_set(
        args.out,
        train=args.train,
        val=args.val,
        seed=args.seed,
        processes=args.processes,
        coco128=args.coco128,
        long_side=args.long_side,
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
