"""A matrix of batch digests over the routes the kernel serves: record it before a kernel change, check it after.

Runs in one process (the user's shell): it prepares a uint8 (the default) and a float32 snapshot of each
dataset in a private store folder (removed at the end), renders batches in this process
(what ``pixpool digest --in-process`` does) and through the reference pipeline (decode per
sample, no snapshot: ``--reference``), and digests them with ``shared.stream.digest``.
Every route setting below runs on every source; a change that alters one byte of one batch
changes a digest. The reference path runs on the float32 settings only (it has no dtype).

    python bench/digest_matrix.py --write /tmp/before.json       # record
    python bench/digest_matrix.py --check /tmp/before.json       # compare; exit 1 on a difference
    python bench/digest_matrix.py --check bench/digests.json     # the route's bytes as last defined

``bench/digests.json`` is the matrix recorded with the kernel that defines the route's bytes
(``docs/kernel.md``); a change meant to keep the bytes checks against it, one that redefines
them records it again in the same commit (``tests/integration/test_route_bytes.py`` checks it).

Datasets: the synthetic set (what ``pixpool synth`` writes, 24 images, seed 0, into a temporary folder) and coco128
(``--coco128``, default ``PIXPOOL_COCO128``, else ../shared/data/coco128 beside the checkout; skipped
when absent).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(ROOT / "bench"))
from _common import COCO128_JSON as COCO128  # noqa: E402

# name -> AugmentConfig fields (imgsz is added per dataset); each covers one kernel path or mix.
ROUTES = {
    "default": {},
    "mosaic_off": {"mosaic": 0.0},
    "rotate_shear": {"degrees": 10.0, "shear": 2.0},
    "perspective": {"perspective": 0.0005},
    "rotate_shear_perspective": {"degrees": 10.0, "shear": 2.0, "perspective": 0.0005},
    "mixup": {"mixup": 1.0},
    "copy_paste": {"copy_paste": 0.5},
    "rotate_copy_paste_mixup": {"degrees": 10.0, "shear": 2.0, "copy_paste": 0.5, "mixup": 0.5, "flipud": 0.5},
    "mosaic_off_rotate": {"mosaic": 0.0, "degrees": 10.0},
    "hsv_off": {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0},
    "validation": {"train_route": False},
}


def _matrix(datasets: dict[str, Path], *, imgsz: int, batches: int, store: str) -> dict[str, str]:
    from pixpool.server.local_stream import digest_stream
    from pixpool.server.readers import load_dataset
    from pixpool.server.snapshot.prepare import prepare_snapshot
    from pixpool.server.snapshot.reference import ReferenceSource
    from pixpool.shared.stream.config import AugmentConfig, PrepareOptions, StreamSettings

    out: dict[str, str] = {}
    for dname, path in datasets.items():
        dataset = load_dataset(str(path), None)
        sources = {}
        prepared = []
        try:
            for dtype in ("float32", "uint8"):
                r = prepare_snapshot(dataset, PrepareOptions(imgsz=imgsz, processes=1, dtype=dtype, store=store))
                prepared.append(r)
                sources[dtype] = r.snapshot
            sources["reference"] = ReferenceSource(dataset, imgsz)
            for rname, fields in ROUTES.items():
                for epoch in (0, 1):
                    for hsv_dev in (False, True) if rname == "default" else (False,):
                        st = StreamSettings(
                            seed=3, batch_size=8, hsv_on_device=hsv_dev, augment=AugmentConfig(imgsz=imgsz, **fields)
                        )
                        for sname, source in sources.items():
                            key = f"{dname}/{rname}/epoch{epoch}/{'hsv-device' if hsv_dev else 'hsv-cpu'}/{sname}"
                            out[key] = ",".join(digest_stream(source, st, epoch, batches))
                            print(key, out[key][:16], flush=True)
        finally:
            for r in prepared:
                r.snapshot.release(keep=False)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="record the matrix into this JSON file")
    group.add_argument("--check", type=Path, help="compare against this recorded JSON file")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batches", type=int, default=2, help="batches of 8 per cell")
    p.add_argument("--coco128", type=Path, default=COCO128)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pixpool-digests-") as tmp:
        from pixpool.server.synthetic import write_synthetic

        datasets = {"synth": Path(write_synthetic(Path(tmp) / "synth", num_images=24, seed=0).coco_json)}
        if args.coco128.exists():
            datasets["coco128"] = args.coco128
        store = Path(tmp) / "store"
        store.mkdir()
        got = _matrix(datasets, imgsz=args.imgsz, batches=args.batches, store=str(store))
    if args.write:
        args.write.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"{len(got)} cells written to {args.write}")
        return 0
    recorded = json.loads(args.check.read_text())
    # The cells of the datasets this run has: without coco128 its recorded cells are not compared.
    want = {k: v for k, v in recorded.items() if k.split("/", 1)[0] in datasets}
    differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    for k in differ:
        print(f"DIFFERS {k}: recorded {str(want.get(k))[:16]} now {str(got.get(k))[:16]}")
    unread = (
        f" ({len(recorded) - len(want)} recorded cells of absent datasets not compared)"
        if len(want) < len(recorded)
        else ""
    )
    print(f"{len(got)} cells, {len(differ)} differ from {args.check}{unread}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
