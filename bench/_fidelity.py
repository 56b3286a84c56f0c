"""``bench/vs_ultralytics.py --what fidelity``: is pixpool's stream the same augmentation as Ultralytics' own loader?

Runs in pixpool's venv (a daemon in a spawned process and this process as its trainer);
the Ultralytics arm runs in a venv with Ultralytics (``--ul-python``) as
``bench/_ultralytics_arm.py collect`` (workers=0, python/numpy/torch seeded), which never
imports pixpool. Both compute their figures with ``bench/_fidelity_stats.py``.

Same coco128 images and YOLO labels, imgsz 640, batch 16, the detect route of
``_ultralytics_arm.TASK_ROUTES`` (mosaic 1.0, translate 0.1, scale 0.5, fliplr 0.5, HSV
0.015/0.7/0.4, no rotation, shear, perspective, mixup or copy-paste), ``--epochs`` epochs
of 128 images from each, fixed seeds. Each arm streams twice: HSV on (pixel mean and std,
boxes, gains) and HSV off (the fill share: pixels whose three channels are exactly 114,
which HSV would move off 114; with HSV off both routes leave exposed padding at exactly
the fill). HSV gains: pixpool's are ``pixpool.shared.stream.rng.hsv_gains`` for each delivered
sample, the function its workers draw them with; Ultralytics' are recorded by wrapping its
``RandomHSV`` (see ``_ultralytics_arm.py``). The hue change per image is measured the same
way in both (OpenCV 8-bit HSV of the image before and after the jitter, pixels with S and V
>= 32): for pixpool, the HSV-off stream is the HSV-on stream's image before the jitter
(the gains come from their own random stream, so the geometry is the same; checked).

Tolerances (``_fidelity_stats``): each metric at ``--alpha`` (default 0.001, so that with
16 metrics two identical routes fail somewhere with probability < 2 %):
distributions by the two-sample KS statistic against its critical value (per-box figures
at the number of images, the independent unit), means by z standard errors. With
``--null`` (default on, off with ``--quick``) a second Ultralytics stream with another
seed shows what the same route gives against itself.

Output: the markdown table, and ``--grid PNG`` (default docs/fidelity_grid.png): the first
8 images of each HSV-on stream, pixpool's above Ultralytics', boxes drawn.

Per task (``--task segment|pose|obb``): one stream from each arm with that task's route
(segment with copy-paste 0.5 on coco128's ``labels-seg``; pose and obb with the detect
settings on ``pixpool synth --task pose|obb``, 128 images, seed 0), HSV on, and the task's own
figures beside the boxes (``_fidelity_stats``: ``mask_figures``, ``keypoint_figures``, the
angles), from what each trainer receives: pixpool's target rows (obb: column 6, radians; pose:
columns 6.. as K x (x, y, v)) and ``batch.masks``; Ultralytics' ``masks``, ``keypoints`` and
``bboxes`` (xywhr). ``task_rows`` lists the rows. Their tolerances were fixed before any
pixpool figure of these tasks existed, by the same rules as the detect table (``TASK_TOLERANCES``).

The integration tests (``tests/integration/test_fidelity_*.py``) call ``parse_args``, ``run``
and ``run_task`` of this module with ``--quick``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import _fidelity_stats as fs  # noqa: E402
import _ultralytics_arm as ularm  # noqa: E402

DETECT = ularm.PIXPOOL_ROUTES["detect"]
HUE_MIN_SV = 32  # the same threshold as _ultralytics_arm.py
CHANNELS = "RGB"
# Metrics where pixpool's route is known to differ from Ultralytics 8.4's, and how. A row
# named here is reported like any other; the test does not require it to pass.
# Rows expected to fail, each with its reason (none since the hue shift follows Ultralytics 8.3.79+: shared/stream/hsv_tables.py).
KNOWN_DIFFERENCES: dict[str, str] = {}


def _hue(bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import cv2

    hsv = cv2.cvtColor(bgr, cv2.COLOR_BGR2HSV)
    return hsv[..., 0], (hsv[..., 1] >= HUE_MIN_SV) & (hsv[..., 2] >= HUE_MIN_SV)


def _bgr(chw_rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(chw_rgb.transpose(1, 2, 0)[:, :, ::-1])


@contextlib.contextmanager
def _served(data_yaml: Path, task: str, imgsz: int, workers: int):
    """A daemon serving ``task``'s snapshot of ``data_yaml`` (prepared here, removed after); its socket folder."""
    from pixpool.server.readers import load_dataset

    dataset = load_dataset(data_yaml, task=task)
    fields = {"data": str(data_yaml), "imgsz": imgsz, "task": task, "keep_snapshot": True, "no_val": True}
    with (
        common.prepared(dataset, imgsz=imgsz, processes=2, task=task),
        common.daemon(workers=workers, **fields) as (d, _),
    ):
        yield d


def pixpool_collect(data_yaml: Path, *, epochs: int, seed: int, workers: int, imgsz: int, batch: int) -> dict:
    """Both pixpool streams (HSV on and off) through a daemon, as a trainer receives them."""
    import pixpool.client
    from pixpool.shared.stream.rng import hsv_gains

    on, off, gains, shifts, grid, grid_boxes = [], [], [], [], [], []
    with _served(data_yaml, "detect", imgsz, workers) as d:
        common = {"batch_size": batch, "seed": seed, "imgsz": imgsz, "timeout_s": 300.0}
        no_hsv = {**DETECT, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}
        with (
            pixpool.client.attach(d, **common, **DETECT) as with_hsv,
            pixpool.client.attach(d, **common, **no_hsv) as without,
        ):
            for epoch in range(epochs):
                with_hsv.set_epoch(epoch)
                without.set_epoch(epoch)
                for a, b in zip(with_hsv, without, strict=True):
                    ia, ta = a.images.numpy(), a.targets.numpy()
                    ib, tb = b.images.numpy(), b.targets.numpy()
                    if not (np.array_equal(a.indices, b.indices) and np.array_equal(ta, tb)):
                        raise RuntimeError(
                            f"epoch {epoch} batch {a.batch}: the HSV-off stream's samples or targets differ from the HSV-on stream's; the hue change cannot be measured"
                        )
                    on.append(fs.batch_figures(ia, ta[:, 0], ta[:, 2:6]))
                    off.append(fs.batch_figures(ib, tb[:, 0], tb[:, 2:6]))
                    for i, index in enumerate(np.asarray(a.indices).tolist()):
                        gains.append(hsv_gains(seed, epoch, index, DETECT["hsv_h"], DETECT["hsv_s"], DETECT["hsv_v"]))
                        before, mask = _hue(_bgr(ib[i]))
                        after, _ = _hue(_bgr(ia[i]))
                        shifts.append(fs.hue_shift(before, after, mask))
                        if len(grid) < 8:
                            grid.append(ia[i].copy())
                            grid_boxes.append(ta[ta[:, 0] == i, 2:6].copy())
    return {
        "on": fs.concat(on),
        "off": fs.concat(off),
        "gains": np.array(gains),
        "hue_shift": np.array(shifts),
        "grid": np.stack(grid),
        "grid_boxes": grid_boxes,
    }


def ul_collect(
    ul_python: str, data_dir: Path, out_dir: Path, *, epochs: int, seed: int, imgsz: int, batch: int
) -> dict:
    """Ultralytics' two streams (HSV on and off), each a fresh process."""
    got = {}
    for hsv in (1, 0):
        out = out_dir / f"ul_seed{seed}_hsv{hsv}.npz"
        ularm.run(ul_python, "collect", data_dir, epochs=epochs, seed=seed, hsv=hsv, imgsz=imgsz, batch=batch, out=out)
        got[hsv] = dict(np.load(out, allow_pickle=True))
    on = got[1]
    keys = ("boxes_per_image", "fill_share", "mean", "std", "box_w", "box_h")
    return {
        "on": {k: on[k] for k in keys},
        "off": {k: got[0][k] for k in keys},
        "gains": on["gains"],
        "hue_shift": on["hue_shift"],
        "grid": on["grid"],
        "grid_boxes": list(on["grid_boxes"]),
    }


def compare(a: dict, b: dict, alpha: float) -> list[fs.Row]:
    """The rows of the table, pixpool (a) against Ultralytics (b)."""
    n_a, n_b = a["on"]["fill_share"].size, b["on"]["fill_share"].size
    rows = [
        fs.compare_ks("boxes per image", a["on"]["boxes_per_image"], b["on"]["boxes_per_image"], alpha),
        fs.compare_mean("boxes per image", a["on"]["boxes_per_image"], b["on"]["boxes_per_image"], alpha),
        fs.compare_ks("box width (fraction of 640)", a["on"]["box_w"], b["on"]["box_w"], alpha, unit_sizes=(n_a, n_b)),
        fs.compare_ks("box height (fraction of 640)", a["on"]["box_h"], b["on"]["box_h"], alpha, unit_sizes=(n_a, n_b)),
        fs.compare_ks("fill share per image, HSV off", a["off"]["fill_share"], b["off"]["fill_share"], alpha),
        fs.compare_mean("fill share per image, HSV off", a["off"]["fill_share"], b["off"]["fill_share"], alpha),
    ]
    for c, name in enumerate(CHANNELS):
        rows.append(fs.compare_mean(f"{name} mean per image", a["on"]["mean"][:, c], b["on"]["mean"][:, c], alpha))
    for c, name in enumerate(CHANNELS):
        rows.append(fs.compare_mean(f"{name} std per image", a["on"]["std"][:, c], b["on"]["std"][:, c], alpha))
    for c, name in enumerate(("hue", "saturation", "value")):
        rows.append(fs.compare_ks(f"{name} gain", a["gains"][:, c], b["gains"][:, c], alpha))
    ha, hb = a["hue_shift"], b["hue_shift"]
    rows.append(fs.compare_ks("hue change per image (levels)", ha[np.isfinite(ha)], hb[np.isfinite(hb)], alpha))
    return rows


def histograms(a: dict, b: dict) -> str:
    """Text histograms of the gains and of the boxes per image, both arms."""
    lines = []
    for c, (name, width) in enumerate((("hue", 0.015), ("saturation", 0.7), ("value", 0.4))):
        edges = np.linspace(1 - width, 1 + width, 6)
        ha = np.histogram(a["gains"][:, c], edges)[0] / len(a["gains"])
        hb = np.histogram(b["gains"][:, c], edges)[0] / len(b["gains"])
        bins = ", ".join(f"[{lo:.4g}, {hi:.4g})" for lo, hi in itertools.pairwise(edges))
        lines.append(
            f"- {name} gain, share per bin {bins}: pixpool {' / '.join(f'{v:.2f}' for v in ha)}; Ultralytics {' / '.join(f'{v:.2f}' for v in hb)}"
        )
    edges = np.array([0, 1, 5, 10, 20, 40, 80, 1000])
    ha = np.histogram(a["on"]["boxes_per_image"], edges)[0] / a["on"]["boxes_per_image"].size
    hb = np.histogram(b["on"]["boxes_per_image"], edges)[0] / b["on"]["boxes_per_image"].size
    labels = ["0", "1-4", "5-9", "10-19", "20-39", "40-79", "80+"]
    lines.append(
        f"- boxes per image, share in {' / '.join(labels)}: pixpool {' / '.join(f'{v:.2f}' for v in ha)}; Ultralytics {' / '.join(f'{v:.2f}' for v in hb)}"
    )
    return "\n".join(lines)


def grid_png(path: Path, a: dict, b: dict, tile: int = 192) -> None:
    """Two rows of 4 from each stream (pixpool on top), boxes drawn; one PNG."""
    import cv2

    def tiles(arm: dict, colour: tuple[int, int, int]) -> list[np.ndarray]:
        out = []
        for img, boxes in zip(arm["grid"], arm["grid_boxes"], strict=True):
            bgr = cv2.resize(_bgr(img), (tile, tile), interpolation=cv2.INTER_AREA)
            for cx, cy, w, h in np.asarray(boxes, dtype=np.float64).reshape(-1, 4):
                p1 = (round((cx - w / 2) * tile), round((cy - h / 2) * tile))
                p2 = (round((cx + w / 2) * tile), round((cy + h / 2) * tile))
                cv2.rectangle(bgr, p1, p2, colour, 1)
            out.append(bgr)
        return out

    def block(title: str, ts: list[np.ndarray]) -> np.ndarray:
        rows = [np.hstack(ts[i : i + 4]) for i in (0, 4)]
        head = np.full((28, rows[0].shape[1], 3), 255, np.uint8)
        cv2.putText(head, title, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
        return np.vstack([head, *rows])

    image = np.vstack(
        [
            block("pixpool (daemon stream)", tiles(a, (0, 255, 0))),
            block("Ultralytics 8.4 loader (cache=ram)", tiles(b, (0, 200, 255))),
        ]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), image, [cv2.IMWRITE_PNG_COMPRESSION, 9])


# -- per task ---------------------------------------------------------------------------------------
# Tolerances of the task rows, fixed on 2026-12-02 before the pixpool arm of any of these tasks
# had run (the task routes and readers were still being written): the detect table's
# rules, unchanged. Every row at --alpha (0.001); distributions by the two-sample KS statistic
# against c(alpha) sqrt((n+m)/nm), per-instance and per-point figures judged at the number of
# images (the independent unit: a mosaic's instances share its scale and crop); means within
# z(alpha/2) standard errors (per-instance and per-keypoint means at the count of instances or
# points, generous to neither arm: those cluster by image, so the rows are strict); the angle histogram
# (TV distance, 36 bins of 7.5 degrees over [-90, 180) so that any angle convention lands in
# a bin) against the (1 - alpha) quantile of 2000 random splits of the pooled images.
TASK_TOLERANCES = {"angle_bins": 36, "angle_range_rad": (-math.pi / 2, math.pi), "rounds": 2000}
ANGLE_EDGES = np.linspace(*TASK_TOLERANCES["angle_range_rad"], TASK_TOLERANCES["angle_bins"] + 1)


def _task_figures(task: str, images, targets, masks, first_image: int) -> dict[str, np.ndarray]:
    """pixpool's figures of one batch: (B, 3, S, S) uint8 images, (n, W) target rows, masks or None."""
    figures = fs.batch_figures(images, targets[:, 0], targets[:, 2:6])
    if task == "segment":
        if masks is None:
            raise RuntimeError("a segment batch came without masks: this pixpool does not render them")
        figures.update(fs.mask_figures(masks, targets[:, 0], targets[:, 2:6]))
    elif task == "pose":
        k = (targets.shape[1] - 6) // 3
        if k < 1 or targets.shape[1] != 6 + 3 * k:
            raise RuntimeError(f"pose target rows have {targets.shape[1]} columns, expected 6 + 3K")
        figures.update(fs.keypoint_figures(targets[:, 6:].reshape(-1, k, 3), targets[:, 2:6]))
    elif task == "obb":
        if targets.shape[1] != 7:
            raise RuntimeError(f"obb target rows have {targets.shape[1]} columns, expected 7 (xywh + angle)")
        figures["obb_angle"] = targets[:, 6].astype(np.float64)
        figures["obb_angle_image"] = targets[:, 0].astype(np.int64) + first_image
    return figures


def pixpool_collect_task(data_yaml: Path, task: str, *, epochs: int, seed: int, workers: int, imgsz: int, batch: int):
    """One pixpool stream of ``task`` through a daemon, HSV on, as a trainer receives it."""
    import pixpool.client

    parts, seen = [], 0
    with _served(data_yaml, task, imgsz, workers) as d:
        common = {"batch_size": batch, "seed": seed, "imgsz": imgsz, "timeout_s": 300.0}
        with pixpool.client.attach(d, **common, **ularm.PIXPOOL_ROUTES[task]) as loader:
            if getattr(loader, "task", task) != task:
                raise RuntimeError(f"the daemon serves the {loader.task} task, not {task}")
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for b in loader:
                    masks = getattr(b, "masks", None)
                    images, targets = b.images.numpy(), b.targets.numpy()
                    masks = None if masks is None else np.asarray(masks.numpy() if hasattr(masks, "numpy") else masks)
                    parts.append(_task_figures(task, images, targets, masks, seen))
                    seen += images.shape[0]
    return fs.concat(parts)


def ul_collect_task(ul_python: str, data_dir: Path, out_dir: Path, task: str, *, epochs, seed, imgsz, batch) -> dict:
    out = out_dir / f"ul_{task}_seed{seed}.npz"
    ularm.run(
        ul_python, "collect", data_dir, task=task, epochs=epochs, seed=seed, hsv=1, imgsz=imgsz, batch=batch, out=out
    )
    got = dict(np.load(out, allow_pickle=True))
    return {k: v for k, v in got.items() if k not in ("grid", "grid_boxes", "gains", "hue_shift")}


def _by_image(values: np.ndarray, image: np.ndarray) -> list[np.ndarray]:
    """Split per-instance values into one array per image that has any (for the permutation test)."""
    order = np.argsort(image, kind="stable")
    values, image = values[order], image[order]
    cuts = np.flatnonzero(np.diff(image)) + 1
    return np.split(values, cuts)


def task_rows(task: str, a: dict, b: dict, alpha: float) -> list[fs.Row]:
    """The rows of one task's table, pixpool (a) against Ultralytics (b)."""
    units = (a["fill_share"].size, b["fill_share"].size)
    rows = [
        fs.compare_ks("boxes per image", a["boxes_per_image"], b["boxes_per_image"], alpha),
        fs.compare_mean("boxes per image", a["boxes_per_image"], b["boxes_per_image"], alpha),
        fs.compare_ks("box width (fraction of imgsz)", a["box_w"], b["box_w"], alpha, unit_sizes=units),
        fs.compare_ks("box height (fraction of imgsz)", a["box_h"], b["box_h"], alpha, unit_sizes=units),
    ]
    if task == "segment":
        rows += [
            fs.compare_ks("mask coverage per image", a["mask_coverage"], b["mask_coverage"], alpha),
            fs.compare_mean("mask coverage per image", a["mask_coverage"], b["mask_coverage"], alpha),
            fs.compare_ks("mask area per instance (share of plane)", a["mask_area"], b["mask_area"], alpha, units),
            fs.compare_ks("mask IoU with its own box", a["mask_box_iou"], b["mask_box_iou"], alpha, units),
            fs.compare_mean("mask IoU with its own box", a["mask_box_iou"], b["mask_box_iou"], alpha),
        ]
    elif task == "pose":
        rows += [
            fs.compare_ks("visible keypoints per instance", a["kpt_visible"], b["kpt_visible"], alpha, units),
            fs.compare_mean("visible keypoints per instance", a["kpt_visible"], b["kpt_visible"], alpha),
            fs.compare_ks("keypoint x in its box (0..1)", a["kpt_rel_x"], b["kpt_rel_x"], alpha, units),
            fs.compare_ks("keypoint y in its box (0..1)", a["kpt_rel_y"], b["kpt_rel_y"], alpha, units),
        ]
        for k in range(min(a["kpt_rel_x_of"].shape[1], b["kpt_rel_x_of"].shape[1])):
            xa, xb = a["kpt_rel_x_of"][:, k], b["kpt_rel_x_of"][:, k]
            rows.append(fs.compare_mean(f"keypoint {k} x in its box", xa[np.isfinite(xa)], xb[np.isfinite(xb)], alpha))
    elif task == "obb":
        ga = _by_image(a["obb_angle"], a["obb_angle_image"])
        gb = _by_image(b["obb_angle"], b["obb_angle_image"])
        rows += [
            fs.compare_ks("angle (radians)", a["obb_angle"], b["obb_angle"], alpha, units),
            fs.compare_histogram(
                "angle histogram, 7.5 degree bins", ga, gb, ANGLE_EDGES, alpha, rounds=TASK_TOLERANCES["rounds"]
            ),
        ]
    return rows


def _null_block(args, null_rows: list[fs.Row] | None) -> list[str]:
    """The table of Ultralytics against itself under another seed: the spread of the route."""
    if null_rows is None:
        return []
    other = f"ultralytics seed {args.seed + 1}"
    head = f"Ultralytics against itself (seed {args.seed + 1} against seed {args.seed}), the spread of the route:"
    return ["", head, "", fs.markdown(null_rows, (other, "ultralytics"))]


def run_task(args) -> tuple[str, list[fs.Row], list[fs.Row] | None]:
    """``--task segment|pose|obb``: one table for that task (module docstring)."""
    versions = common.ul_version(args.ul_python)
    load_before = common.load()
    root = Path(tempfile.mkdtemp(prefix="pxfid-"))
    opts = {"epochs": args.epochs, "imgsz": args.imgsz, "batch": args.batch}
    try:
        data_dir = common.make_data_dir(root, args.task, args.coco128)
        ul = ul_collect_task(args.ul_python, data_dir, root, args.task, seed=args.seed, **opts)
        ul2 = (
            ul_collect_task(args.ul_python, data_dir, root, args.task, seed=args.seed + 1, **opts)
            if args.null
            else None
        )
        px = None
        if not args.ul_only:
            px = pixpool_collect_task(data_dir / "data.yaml", args.task, seed=args.seed, workers=args.workers, **opts)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = task_rows(args.task, px, ul, args.alpha) if px is not None else []
    null_rows = task_rows(args.task, ul2, ul, args.alpha) if ul2 is not None else None
    load_after = common.load()
    source = "coco128's labels-seg" if args.task == "segment" else f"`pixpool synth --task {args.task}` (128 images)"
    n = ul["fill_share"].size
    hist = f"; the angle histogram against {TASK_TOLERANCES['rounds']} image permutations" if args.task == "obb" else ""
    lines = [
        f"`{args.command}`",
        "",
        (
            f"{args.task}: {source} at {args.imgsz}, batch {args.batch}, {args.epochs} epochs ({n} images) from each arm, seed {args.seed}, "
            f"route {', '.join(f'{k} {v}' for k, v in ularm.PIXPOOL_ROUTES[args.task].items() if v)} (pixpool: daemon with {args.workers} workers; "
            f"Ultralytics {versions.split()[0]}: its loader, workers=0, seeded). Per row alpha = {args.alpha}; per-instance rows at the image counts"
            f"{hist}. Load average before / after: {load_before} / {load_after}."
        ),
    ]
    if rows:
        lines += ["", fs.markdown(rows)]
    else:
        lines += [
            "",
            "pixpool arm: not run (`--ul-only`).",
        ]
    lines += _null_block(args, null_rows)
    failed = sorted({r.metric for r in rows if not r.passed})
    if failed:
        lines += ["", "Rows that do not pass: " + ", ".join(failed) + "."]
    return "\n".join(lines), rows, null_rows


def run(args) -> tuple[str, list[fs.Row], list[fs.Row] | None]:
    versions = common.ul_version(args.ul_python)
    load_before = common.load()
    root = Path(tempfile.mkdtemp(prefix="pxfid-"))
    try:
        data_dir = common.make_data_dir(root, "detect", args.coco128)
        px = pixpool_collect(
            data_dir / "data.yaml",
            epochs=args.epochs,
            seed=args.seed,
            workers=args.workers,
            imgsz=args.imgsz,
            batch=args.batch,
        )
        ul = ul_collect(
            args.ul_python, data_dir, root, epochs=args.epochs, seed=args.seed, imgsz=args.imgsz, batch=args.batch
        )
        ul2 = (
            ul_collect(
                args.ul_python,
                data_dir,
                root,
                epochs=args.epochs,
                seed=args.seed + 1,
                imgsz=args.imgsz,
                batch=args.batch,
            )
            if args.null
            else None
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = compare(px, ul, args.alpha)
    null_rows = compare(ul2, ul, args.alpha) if ul2 is not None else None
    if args.grid:
        grid_png(args.grid, px, ul)
    load_after = common.load()
    n = px["on"]["fill_share"].size
    lines = [
        f"`{args.command}`",
        "",
        (
            f"coco128 at {args.imgsz}, batch {args.batch}, detect settings, {args.epochs} epochs ({n} images) from each arm, seed {args.seed} "
            f"(pixpool: daemon with {args.workers} workers, streamed to this process; Ultralytics {versions.split()[0]}: its loader, workers=0, "
            f"random / numpy / torch seeded). Per metric alpha = {args.alpha}: KS critical value c(alpha) sqrt((n+m)/nm), per-box rows at the image counts; "
            f"means within z(alpha/2) standard errors. Load average before / after: {load_before} / {load_after}."
        ),
        "",
        fs.markdown(rows),
    ]
    lines += _null_block(args, null_rows)
    lines += ["", "Histograms:", "", histograms(px, ul)]
    failed = [r.metric for r in rows if not r.passed]
    if failed:
        lines += ["", "Rows that do not pass: " + ", ".join(sorted(set(failed))) + "."]
        for metric in sorted(set(failed)):
            if metric in KNOWN_DIFFERENCES:
                lines.append(f"- {metric}: {KNOWN_DIFFERENCES[metric]}.")
    if args.grid:
        shown = args.grid.resolve()
        root = Path(__file__).resolve().parents[1]
        shown = shown.relative_to(root) if shown.is_relative_to(root) else shown
        lines += [
            "",
            f"Side by side: `{shown}` (first 8 images of each HSV-on stream, pixpool above, Ultralytics below, boxes drawn).",
        ]
    return "\n".join(lines), rows, null_rows


def parse_args(argv):
    parser = common.parser(__doc__, "vs_ultralytics.py --what fidelity")
    parser.add_argument(
        "--quick", action="store_true", help="2 epochs (256 images) per arm and no Ultralytics-vs-Ultralytics reference"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs of 128 images per arm (default 4; 2 with --quick)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--task",
        choices=ularm.TASKS,
        default="detect",
        help="the task's stream and figures (default detect: the table above)",
    )
    parser.add_argument(
        "--ul-only",
        action="store_true",
        help="--task segment|pose|obb: the Ultralytics arm alone (and its null), where pixpool's task route is absent",
    )
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument(
        "--null", type=int, default=None, help="1: also compare two Ultralytics streams (default 1; 0 with --quick)"
    )
    parser.add_argument("--workers", type=int, default=2, help="pixpool daemon workers (the bytes do not depend on it)")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--ul-python", default=common.UL_PYTHON, help="Python of a venv with Ultralytics (env PIXPOOL_UL_PYTHON)"
    )
    parser.add_argument("--coco128", type=Path, default=common.COCO128)
    parser.add_argument(
        "--grid",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "docs" / "fidelity_grid.png",
        help="PNG to write ('' for none)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--write", type=Path, default=None, help="markdown file whose 'Fidelity' section to replace")
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (2 if args.quick else 4)
    args.null = bool(args.null if args.null is not None else not args.quick)
    args.grid = args.grid if str(args.grid) else None
    return args


def _as_dicts(rows: list[fs.Row]) -> list[dict]:
    return [{**vars(r), "passed": r.passed} for r in rows]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    text, rows, null_rows = run(args) if args.task == "detect" else run_task(args)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps({"rows": _as_dicts(rows), "null_rows": _as_dicts(null_rows) if null_rows else None}, indent=1)
        )
    if args.write and args.task == "detect":
        common.write_section(args.write, "fidelity", text, "## Latest run: fidelity against Ultralytics' loader")
    elif args.write:
        heading = f"## Latest run: fidelity against Ultralytics' loader, {args.task}"
        common.write_section(args.write, f"fidelity-{args.task}", text, heading)
    return 0


if __name__ == "__main__":
    sys.exit(main())
