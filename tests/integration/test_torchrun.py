"""``torchrun --nproc-per-node 2`` on the CPU (gloo): the example DDP script's ranks attach to
one daemon, get disjoint shards covering each epoch once, and share its one snapshot.

Integration test: the daemon runs in a spawned process; torchrun and its ranks are children.
"""

from __future__ import annotations

from helpers.daemon import real_daemon
from helpers.ranks import TORCHRUN, check_each_index_once, example_args, read_records, run_group
from pixpool.shared.transport.names import ring_prefix

IMGSZ, EPOCHS, RECORDS = 96, 2, 24


def test_torchrun_two_ranks_share_one_daemon_and_split_each_epoch(synthetic_data, tmp_path):
    record = tmp_path / "ranks.jsonl"
    with real_daemon(synthetic_data.coco_json, imgsz=IMGSZ, workers=2) as (proc, d):
        cmd = [
            *TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            *example_args(d, record, epochs=EPOCHS, imgsz=IMGSZ, batch_size=4),
        ]
        done = run_group(cmd)
        assert done.returncode == 0, done.stdout[-4000:]
        daemon_pid = proc.pid
    records = read_records(record)
    assert len(records) == 2 * EPOCHS
    check_each_index_once(records, num_records=RECORDS, epochs=EPOCHS, world_size=2)
    assert all(r["world_size"] == 2 and r["batches"] == 3 for r in records)  # 12 samples per rank in batches of 4

    # What the kernel said at the end of each epoch: the daemon maps exactly one snapshot, and
    # each rank maps its own ring of that same daemon. Ranks never map the snapshot itself:
    # workers render into the ring, the rank reads the ring. (/dev/shm is the machine's: other
    # runs' segments are in it too, so only what this daemon and these ranks map counts.)
    rank_pids = {r["rank"]: r["pid"] for r in records}
    assert len(set(rank_pids.values())) == 2
    for r in records:
        segs = r["segments"]
        snapshots = {n.rsplit("-", 1)[0] for n, pids in segs.items() if "-snap-" in n and daemon_pid in pids}
        assert len(snapshots) == 1, segs
        (snap,) = snapshots
        assert all(daemon_pid in segs[f"{snap}-{part}"] for part in ("meta", "img", "tgt")), segs
        rings = {n: set(p) for n, p in segs.items() if n.startswith(ring_prefix(daemon_pid))}
        ring_of = {pid: [n for n, users in rings.items() if pid in users] for pid in rank_pids.values()}
        assert all(len(v) == 1 for v in ring_of.values()), ring_of  # one ring per rank, of the one daemon
        assert ring_of[rank_pids[0]] != ring_of[rank_pids[1]]
        assert not any(pid in segs[f"{snap}-img"] for pid in rank_pids.values())
