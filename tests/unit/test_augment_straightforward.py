"""The whole route against a straightforward version of it: every shortcut is byte-neutral.

The straightforward version builds the full canvas, restores the fill right after the
resample, pastes instance by instance, flips with numpy, quantises with ``np.rint``,
does HSV with split / three LUTs / merge, and reorders with ``transpose``. It shares
only the draws and the label geometry with the route. Equal bytes prove the partial
canvas, the padded 4-channel canvas and resample, the deferred (fused) fill add and its
one-array quantisation pass, the union paste over its bounding box, the 8-bit flip,
the two-bytes-at-a-time HSV lookups and the split into planes change nothing.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from helpers.sources import ArraySource
from pixpool.server.augment import affine, render_batch
from pixpool.server.augment import copy_paste as cp_mod
from pixpool.server.augment.labels import Labels, pack, transform_labels
from pixpool.server.augment.mosaic import draw_mosaic, letterbox_tile, mosaic_tiles
from pixpool.shared.config import AugmentConfig, StreamSettings
from pixpool.shared.hsv_tables import luts
from pixpool.shared.rng import hsv_gains, sample_generator
from pixpool.shared.sampler import num_batches

S = 64
FILL = np.float32(114.0)


def _pre(source, index: int, cfg: AugmentConfig, closed: bool, rng) -> tuple[np.ndarray, Labels]:
    if not closed and cfg.mosaic > 0 and rng.random() < cfg.mosaic:
        partners, xc, yc = draw_mosaic(rng, len(source), S)
        tiles, labels = mosaic_tiles(source, [index, *partners.tolist()], S, xc, yc)
        hw = (2 * S, 2 * S)
    else:
        tiles, labels = letterbox_tile(source, index, S)
        hw = (S, S)
    canvas = np.zeros((*hw, 3), np.float32)
    for image, (xa0, ya0, xa1, ya1), (xb0, yb0) in tiles:
        canvas[ya0:ya1, xa0:xa1] = image[yb0 : yb0 + ya1 - ya0, xb0 : xb0 + xa1 - xa0]
    matrix, scale = affine.draw_matrix(rng, cfg, hw, S)
    if hw == (S, S) and np.array_equal(matrix, np.eye(3)):
        warped = canvas.copy()
    elif affine.is_perspective(matrix):
        warped = cv2.warpPerspective(canvas, matrix, (S, S), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
    else:
        warped = cv2.warpAffine(canvas, matrix[:2], (S, S), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
    image = warped + FILL
    labels = transform_labels(labels, matrix, S, scale, perspective=affine.is_perspective(matrix))
    if not closed and cfg.copy_paste > 0 and len(labels):
        flipped = labels.flipped(S, S, horizontal=True)
        chosen = cp_mod.select(labels, flipped, cfg.copy_paste, rng)
        if len(chosen):
            pasted = flipped.select(chosen)
            mirror = image[:, ::-1]
            out = image.copy()
            for polygon in pasted.polygons:
                mask = np.zeros((S, S), np.uint8)
                cp_mod.rasterise(mask, polygon)
                out[mask.astype(bool)] = mirror[mask.astype(bool)]
            image, labels = out, Labels.concat([labels, pasted])
    return image, labels


def straightforward(source, index: int, st: StreamSettings, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uint8 3 x S x S RGB, packed targets, float image) of one sample."""
    cfg = st.augment
    rng = sample_generator(st.seed, epoch, index)
    closed = cfg.mosaic_closed(epoch)
    image, labels = _pre(source, index, cfg, closed, rng)
    if not closed and cfg.mixup > 0 and rng.random() < cfg.mixup:
        partner = int(rng.integers(0, len(source)))
        image2, labels2 = _pre(source, partner, cfg, closed, rng)
        ratio = np.float32(rng.beta(32.0, 32.0))
        image = image * ratio + image2 * (np.float32(1) - ratio)
        labels = Labels.concat([labels, labels2])
    if rng.random() < cfg.flipud:
        image, labels = image[::-1], labels.flipped(S, S, horizontal=False)
    if rng.random() < cfg.fliplr:
        image, labels = image[:, ::-1], labels.flipped(S, S, horizontal=True)
    image = np.ascontiguousarray(image)
    u8 = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    gains = hsv_gains(st.seed, epoch, index, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v)
    if not np.all(gains == 1):
        th, ts, tv = luts(gains)
        h, s, v = cv2.split(cv2.cvtColor(u8, cv2.COLOR_BGR2HSV))
        u8 = cv2.cvtColor(cv2.merge((cv2.LUT(h, th), cv2.LUT(s, ts), cv2.LUT(v, tv))), cv2.COLOR_HSV2BGR)
    return np.ascontiguousarray(u8[:, :, ::-1].transpose(2, 0, 1)), pack(labels, S), image


ROUTES = {
    "default": {},
    "no_mosaic": {"mosaic": 0.0},
    "identity": {"mosaic": 0.0, "translate": 0.0, "scale": 0.0},
    "copy_paste_mixup": {"copy_paste": 0.7, "mixup": 0.6, "degrees": 15.0, "flipud": 0.5},
    "perspective": {"perspective": 0.001, "shear": 5.0, "copy_paste": 1.0},
    "closed": {"close_mosaic": 1, "epochs": 2, "copy_paste": 1.0, "mixup": 1.0},
}


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_route_equals_straightforward_version(name: str) -> None:
    src = ArraySource([(64, 48), (40, 64), (64, 64), (1, 64), (64, 30), (50, 60), (64, 64)], S, seed=21, instances=5)
    st = StreamSettings(seed=6, batch_size=4, augment=AugmentConfig(imgsz=S, **ROUTES[name]))
    for epoch in (0, 1):
        for b in range(num_batches(len(src), st, epoch)):
            r = render_batch(src, st, epoch, b, keep_float=True)
            rows = []
            for k, index in enumerate(r.samples.tolist()):
                image, packed, floats = straightforward(src, index, st, epoch)
                assert r.floats[k].tobytes() == floats.tobytes()
                assert r.images[k].tobytes() == image.tobytes()
                rows.append(np.concatenate([np.full((len(packed), 1), k, np.float32), packed], axis=1))
            assert r.targets.tobytes() == np.concatenate(rows).tobytes()
