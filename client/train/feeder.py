"""The device feeder: a batch from its ring slot to the training step's static device buffers.

Runs in the trainer process, called by ``DetectorStep``. On the CPU it copies the batch into
the static buffers and that is all. On CUDA the copy of batch n+1 overlaps step n:

1. ``put`` (host): the slot's bytes are copied into one of two pinned staging buffers (a
   CPU memcpy; after it the ring slot can be released to the daemon), then a side stream
   copies them asynchronously into the *incoming* device buffers, once the previous batch
   has left them (event ``_taken``), and records ``_arrived``.
2. ``take`` (device, compute stream): waits for ``_arrived``, copies incoming -> static
   (a device-to-device copy of one batch), records ``_taken``; the captured graph then
   reads only the static buffers, so the side stream may fill the incoming ones with the
   next batch while the graph runs.

A pinned staging buffer is reused only after its previous host-to-device copy finished.
Registering the shared-memory slots themselves as pinned memory (``cudaHostRegister``)
would save the memcpy; it needs a GPU to be tried and is not done here.
"""

from __future__ import annotations

import numpy as np
import torch


class Feeder:
    def __init__(self, *, batch_size: int, imgsz: int, max_targets: int, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        shapes = {
            "images": ((batch_size, 3, imgsz, imgsz), torch.uint8),
            "targets": ((batch_size, max_targets, 5), torch.float32),
            "mask": ((batch_size, max_targets), torch.bool),
        }
        self.static = {k: torch.zeros(shape, dtype=dtype, device=device) for k, (shape, dtype) in shapes.items()}
        if self.cuda:
            self._incoming = {k: torch.zeros(shape, dtype=dtype, device=device) for k, (shape, dtype) in shapes.items()}
            self._staging = [
                {k: torch.empty(shape, dtype=dtype, pin_memory=True) for k, (shape, dtype) in shapes.items()}
                for _ in range(2)
            ]
            self._copied = [torch.cuda.Event(), torch.cuda.Event()]
            self._arrived = torch.cuda.Event()
            self._taken = torch.cuda.Event()
            self._stream = torch.cuda.Stream(device)
            self._next = 0
        self._pending = False

    def put(self, images: torch.Tensor, targets: np.ndarray, mask: np.ndarray) -> None:
        """Hand over the next batch (host arrays); returns once the slot's bytes are copied."""
        if self._pending and not self.cuda:
            raise RuntimeError("a batch is already waiting; take it before putting the next")
        host = {"images": images, "targets": torch.from_numpy(targets), "mask": torch.from_numpy(mask)}
        if not self.cuda:
            for k, v in host.items():
                self.static[k].copy_(v)
            self._pending = True
            return
        k = self._next
        self._next ^= 1
        self._copied[k].synchronize()  # staging k is free once its last copy to the device finished
        stage = self._staging[k]
        for name, v in host.items():
            stage[name].copy_(v)
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(self._taken)  # the previous batch has left the incoming buffers
            for name, v in stage.items():
                self._incoming[name].copy_(v, non_blocking=True)
            self._copied[k].record(self._stream)
            self._arrived.record(self._stream)
        self._pending = True

    def take(self) -> None:
        """Make the batch handed over last the static buffers' content (on the compute stream)."""
        if not self._pending:
            raise RuntimeError("no batch was put since the last step")
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(self._arrived)
            for name, buf in self.static.items():
                buf.copy_(self._incoming[name])
            self._taken.record(current)
        self._pending = False
