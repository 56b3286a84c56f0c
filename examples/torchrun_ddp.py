"""A DDP training loop fed by the node's pixpool daemon: copy this file and put your model in.

Runs in each rank that ``torchrun`` starts. One daemon serves the node (``pixpool serve``);
every rank of the node attaches to it through ``pixpool.client.attach()``, which takes the
rank and world size from the initialised ``torch.distributed`` group, so each rank gets a
disjoint shard of every epoch and all ranks together see each sample once. The daemon holds
one snapshot for all of them; each rank only maps its own batch ring. The ranks train at the
size and task the daemon serves (``--imgsz`` only to insist on one: a daemon serving another
is refused, naming both); rank 0 prints them when it has attached.

One node, 2 ranks (gloo on the CPU, NCCL with one GPU per rank)::

    pixpool serve data.yaml --socket-dir /run/pixpool --workers 8 &
    torchrun --nproc-per-node 2 examples/torchrun_ddp.py --socket-dir /run/pixpool --epochs 10

Two nodes, each with its own daemon (run on both, ``--node-rank`` 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint node0:29400 --rdzv-id job1 examples/torchrun_ddp.py --socket-dir /run/pixpool

A node without a daemon (or GPU nodes fed by a CPU-only data node) attaches its ranks over
TCP instead, with the CURVE keys of ``pixpool keys DIR`` (the daemon runs ``pixpool serve
DATA --tcp 0.0.0.0:5555 --keys DIR``); the batches then cross the network as frames::

    torchrun ... examples/torchrun_ddp.py --endpoint tcp://datanode:5555 --keys /etc/pixpool/keys

``--record PATH`` appends one JSON line per rank and epoch (rank, pid, host, the record
indices it trained on, the pixpool segments mapped at the end of the epoch and by which
pids): what the tests read to check shards; leave it off in real runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import pixpool.client
from pixpool.client.train.detect import DetectionLoss, Detector, pad_targets

# Tasks whose target rows are (batch_index, class, cx, cy, w, h): the detector's loss reads those
# (segment's masks come beside the rows); obb and pose rows carry more columns (shared/task.py).
_BOX_TASKS = ("detect", "segment")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP training of the reference detector on a pixpool stream")
    p.add_argument(
        "--socket-dir", default=None, help="the node daemon's socket directory (as given to `pixpool serve`)"
    )
    p.add_argument(
        "--endpoint", default=None, metavar="tcp://HOST:PORT", help="a remote daemon over TCP instead (needs --keys)"
    )
    p.add_argument(
        "--keys", default=None, metavar="DIR", help="CURVE key directory for --endpoint (made by `pixpool keys DIR`)"
    )
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16, help="images per rank per step")
    p.add_argument(
        "--imgsz",
        type=int,
        default=None,
        help="training image size; default: the daemon's (give it only to insist on one: a daemon serving "
        "another size is refused, naming both)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="stream seed: the same on every rank (the shards then partition one epoch order)",
    )
    p.add_argument("--scale", default="n", help="detector scale: n, s, m, or tiny (CPU)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--max-targets", type=int, default=100, help="box slots per image in the padded targets")
    p.add_argument("--timeout-s", type=float, default=120.0, help="how long a rank waits for its daemon")
    p.add_argument("--record", default=None, metavar="PATH", help="append one JSON line per rank and epoch (tests)")
    return p.parse_args(argv)


def _mapped_segments() -> dict[str, list[int]]:
    """pixpool segment -> pids that map it, as the kernel says (``/proc``)."""
    from pixpool.shared.transport.procmem import segment_users

    return {name: sorted(pids) for name, pids in segment_users().items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    try:
        # Rank and world size come from the group; the same seed on every rank.
        with pixpool.client.attach(
            args.socket_dir,
            endpoint=args.endpoint,
            keys_dir=args.keys,
            batch_size=args.batch_size,
            seed=args.seed,
            imgsz=args.imgsz,
            timeout_s=args.timeout_s,
            zero_copy=True,
        ) as loader:  # the loop below keeps no batch past the next
            torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
            # The daemon's size and task unless the user named a size: what it renders is what the loss needs.
            imgsz = loader.settings.augment.imgsz
            if loader.task not in _BOX_TASKS:
                raise SystemExit(
                    f"examples/torchrun_ddp.py trains the reference detector on boxes; the daemon at "
                    f"{args.endpoint or args.socket_dir} serves task {loader.task!r}: serve a detect or segment set, "
                    "or put a model for that task in this loop"
                )
            if rank == 0:
                print(
                    f"attached: task {loader.task}, imgsz {imgsz}, {len(loader)} batches of {args.batch_size} "
                    f"per rank per epoch, {dist.get_world_size()} ranks",
                    flush=True,
                )
            model = Detector(loader.num_classes, scale=args.scale).to(device)
            ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
            loss_fn = DetectionLoss(loader.num_classes, reg_max=model.reg_max, strides=model.strides)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.937, nesterov=True)
            for epoch in range(args.epochs):
                loader.set_epoch(epoch)
                seen: list[int] = []
                total = torch.zeros((), device=device)
                for batch in loader:
                    images, rows = batch
                    # zero_copy: the batch is a view of a ring slot, copied to the device before the next is asked for.
                    targets, mask = pad_targets(rows.numpy(), len(images), args.max_targets)
                    x = images.to(device, non_blocking=True).float().div_(255.0)
                    loss, _ = loss_fn(
                        ddp(x), torch.from_numpy(targets).to(device), torch.from_numpy(mask).to(device), imgsz
                    )
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    total += loss.detach()
                    seen += batch.indices.tolist()
                dist.all_reduce(total)
                if rank == 0:
                    print(
                        f"epoch {epoch}: mean loss {total.item() / max(1, len(loader) * dist.get_world_size()):.3f}",
                        flush=True,
                    )
                if args.record:
                    dist.barrier()  # every rank is attached while each one looks at /proc
                    _record(
                        args.record,
                        rank=rank,
                        world_size=dist.get_world_size(),
                        local_rank=local_rank,
                        epoch=epoch,
                        indices=seen,
                        batches=len(loader),
                    )
                    dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _record(path: str, **fields) -> None:
    line = {**fields, "pid": os.getpid(), "host": socket.gethostname(), "segments": _mapped_segments()}
    with open(path, "a") as f:  # one short write per line: ranks may append at once
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
