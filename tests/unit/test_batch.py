"""``attach()``'s ``Batch`` through the collection utilities trainers apply to it: torch's
pin-memory and convert helpers, Lightning's device transfer; unpacking, copies, pickling."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data._utils.collate import default_convert  # noqa: E402
from torch.utils.data._utils.pin_memory import pin_memory  # noqa: E402

from pixpool.client.batch import Batch  # noqa: E402


def _batch(epoch: int = 3, batch: int = 7) -> Batch:
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).reshape(2, 3, 4, 4)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2], [1, 0, 0.3, 0.3, 0.1, 0.1]], dtype=torch.float32)
    return Batch(images, targets, indices=np.array([11, 4]), files=["a.jpg", "b.jpg"], epoch=epoch, batch=batch)


def _same(got: Batch, want: Batch) -> None:
    assert isinstance(got, Batch)
    images, targets = got  # unpacks as two, as a DataLoader loop does
    assert torch.equal(images, want.images) and torch.equal(targets, want.targets)
    assert np.asarray(got.indices).tolist() == np.asarray(want.indices).tolist()
    assert list(got.files) == list(want.files)
    assert (got.epoch, got.batch) == (want.epoch, want.batch)


def test_a_batch_unpacks_as_images_and_targets_and_names_its_records():
    b = _batch()
    images, targets = b
    assert images is b.images and targets is b.targets and len(b) == 2
    assert b._fields == ("images", "targets")
    assert b.indices.tolist() == [11, 4] and b.files == ["a.jpg", "b.jpg"] and (b.epoch, b.batch) == (3, 7)
    # Two batches keep their own metadata.
    other = _batch(epoch=4, batch=0)
    assert (b.epoch, b.batch, other.epoch, other.batch) == (3, 7, 4, 0)


def test_rebuilds_by_type_keep_the_metadata():
    b = _batch()
    _same(type(b)(*b), b)  # how named tuples are rebuilt (torch, Lightning)
    _same(type(b)(list(b)), b)  # how other sequences are rebuilt
    _same(b._replace(targets=b.targets * 1), b)
    _same(copy.copy(b), b)
    _same(copy.deepcopy(b), b)
    _same(pickle.loads(pickle.dumps(b)), b)
    with pytest.raises(TypeError, match=r"\(images, targets\); got 3 items"):
        type(b)([b.images, b.targets, b.targets])
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['epochs'\\]"):
        Batch(b.images, b.targets, epochs=1)


def test_torch_pin_memory_and_default_convert_keep_the_batch():
    b = _batch()
    converted = default_convert(b)  # a DataLoader without automatic batching
    _same(converted, b)
    assert isinstance(converted.images, torch.Tensor)
    # pin_memory's rebuild, seen on elements it leaves as they are (pinning a tensor needs CUDA).
    arrays = Batch(b.images.numpy(), b.targets.numpy(), indices=b.indices, files=b.files, epoch=3, batch=7)
    rebuilt = pin_memory(arrays)
    assert isinstance(rebuilt, Batch) and rebuilt is not arrays and rebuilt.images is arrays.images
    assert rebuilt.indices is b.indices and rebuilt.files == b.files and (rebuilt.epoch, rebuilt.batch) == (3, 7)
    if not torch.cuda.is_available():
        pytest.skip("pinning host memory needs CUDA (this machine has none); the rebuild was checked")
    pinned = pin_memory(b)  # DataLoader(pin_memory=True)
    _same(pinned, b)
    assert pinned.images.is_pinned() and pinned.targets.is_pinned()


def test_lightning_device_transfer_and_collection_map_keep_the_batch():
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.apply_func import move_data_to_device
    from lightning_utilities.core.apply_func import apply_to_collection

    b = _batch()
    moved = move_data_to_device(b, torch.device("cpu"))  # what Trainer.fit does to each batch
    _same(moved, b)
    as_double = apply_to_collection(b, torch.Tensor, lambda t: t.double())  # a precision plugin's conversion
    assert isinstance(as_double, Batch) and as_double.images.dtype == torch.float64
    assert as_double.indices.tolist() == [11, 4] and (as_double.epoch, as_double.batch) == (3, 7)
