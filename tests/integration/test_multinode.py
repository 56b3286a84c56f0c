"""Two "nodes" on one machine: ``torchrun --nnodes 2`` across a veth pair, one daemon per node.

Integration test, root only. Each node is a network namespace (``ip netns``) with its own
address (10.77.0.1 and 10.77.0.2 on a veth pair) and, through ``unshare --mount``, its own
tmpfs on /dev/shm, so the two daemons share no segment, as on real nodes. Each node runs its
own ``pixpool serve`` and one torchrun agent; the agents meet through a c10d rendezvous on
node 0's address, and each rank attaches to the daemon of its node. Namespaces, mounts and
processes are removed in ``finally`` whatever happens (the private tmpfs goes with the last
process of its mount namespace).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers.daemon import small_serve_args
from helpers.ranks import TORCHRUN, check_each_index_once, example_args, read_records
from pixpool.shared.transport.names import ring_prefix

IMGSZ, EPOCHS, RECORDS = 96, 2, 24
ADDRS = ("10.77.0.1", "10.77.0.2")
PORT = 29477
TCP_PORT = 29478
NODE_TIMEOUT_S = 150.0
# A node's own mounts (/dev/shm), host name and pids (/proc), as a real node has: the
# namespace's first process is the shell, and everything in it dies with it.
NODE_UNSHARE = ["unshare", "--mount", "--propagation", "private", "--uts", "--pid", "--fork", "--mount-proc"]
PIXPOOL = str(Path(sys.executable).with_name("pixpool"))


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)


class _Nodes:
    """Two network namespaces joined by a veth pair; ``close()`` removes them (and the pair)."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"pxnodeA{tag}", f"pxnodeB{tag}")
        self.veth = (f"pxva{tag}", f"pxvb{tag}")  # at most 15 characters
        self.made: list[str] = []

    def open(self) -> None:
        for ns in self.ns:
            self._run("netns", "add", ns)
            self.made.append(ns)
        self._run("link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for ns, veth, addr in zip(self.ns, self.veth, ADDRS):
            self._run("link", "set", veth, "netns", ns)
            self._run("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            self._run("-n", ns, "link", "set", veth, "up")
            self._run("-n", ns, "link", "set", "lo", "up")

    def _run(self, *args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def close(self) -> None:
        for ns in self.made:  # deleting a namespace deletes the veth end inside it, and the pair
            _ip("netns", "del", ns)
        _ip("link", "del", self.veth[0])  # only if it never moved into its namespace


def _node_script(
    node: int, veth: str, data: str, socket_dir: str, record: Path, pid_file: Path, *, keys: Path | None
) -> str:
    """The shell a node runs in its namespaces: a private /dev/shm, a daemon, one torchrun agent.

    With ``keys``, node 0's daemon also serves TCP (CURVE) on its veth address and node 1 runs
    no daemon: its rank attaches to node 0's over the network."""
    remote = keys is not None and node == 1
    serve = [PIXPOOL, "serve", *small_serve_args(data, socket_dir, IMGSZ)]
    if keys is not None:
        serve += ["--tcp", f"{ADDRS[0]}:{TCP_PORT}", "--keys", str(keys)]
    status = [PIXPOOL, "status", "--socket-dir", socket_dir, "--timeout-s", "1"]
    attach = ["--endpoint", f"tcp://{ADDRS[0]}:{TCP_PORT}", "--keys", str(keys)] if remote else socket_dir
    # Node 0 hosts the rendezvous store: say so, its name does not resolve to its veth address.
    rdzv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-conf",
        f"is_host={int(node == 0)},join_timeout=60",
        "--rdzv-endpoint",
        f"{ADDRS[0]}:{PORT}",
        "--rdzv-id",
        f"pixpool-test-{os.getpid()}",
        "--local-addr",
        ADDRS[node],
    ]
    agent = [
        *TORCHRUN,
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        *rdzv,
        *example_args(attach, record, epochs=EPOCHS, imgsz=IMGSZ, batch_size=4),
    ]
    q = shlex.join
    daemon = f"""
{q(serve)} &
daemon=$!
echo $daemon > {shlex.quote(str(pid_file))}
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon' EXIT
i=0
until {q(status)} >/dev/null 2>&1; do
  i=$((i+1)); [ $i -gt 600 ] && {{ echo "node {node}: daemon not ready" >&2; exit 91; }}
  kill -0 $daemon 2>/dev/null || {{ echo "node {node}: daemon exited" >&2; exit 92; }}
  sleep 0.1
done
"""
    return f"""
set -u
hostname pxnode{node}
mount -t tmpfs -o size=256m,mode=1777 pixpool-node{node} /dev/shm || exit 90
{"" if remote else daemon}
GLOO_SOCKET_IFNAME={veth} {q(agent)}
"""


def _start_node(nodes: _Nodes, node: int, script: str, log: Path) -> subprocess.Popen:
    cmd = ["ip", "netns", "exec", nodes.ns[node], *NODE_UNSHARE, "sh", "-c", script]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(20)


def _wait_both(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Until both nodes exit; a node that fails stops the other (which would wait for its peer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        if any(p.returncode not in (None, 0) for p in procs):
            break
        time.sleep(0.1)  # polling interval of a bounded wait
    for p in procs:
        _stop(p)


@pytest.mark.parametrize("layout", ["daemon-per-node", "tcp-from-node0"])
def test_two_nodes_split_every_epoch(layout, synthetic_data, tmp_path):
    """daemon-per-node: each node's rank reads its own daemon's rings. tcp-from-node0: node 1
    has no daemon; its rank receives node 0's batches over TCP with CURVE across the veth."""
    if os.geteuid() != 0:
        pytest.skip(
            "needs root: the test makes network namespaces (ip netns) and mounts a tmpfs on each node's /dev/shm"
        )
    if not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs `ip` (iproute2) and `unshare` (util-linux) to make the two nodes")
    nodes = _Nodes()
    procs: list[subprocess.Popen] = []
    dirs = [tempfile.mkdtemp(prefix=f"pxn{n}-", dir="/tmp") for n in (0, 1)]
    record = tmp_path / "ranks.jsonl"
    logs = [tmp_path / f"node{n}.log" for n in (0, 1)]
    pid_files = [tmp_path / f"daemon{n}.pid" for n in (0, 1)]
    keys = None
    if layout == "tcp-from-node0":
        from pixpool.shared.transport.endpoint import write_keys

        keys = tmp_path / "keys"
        write_keys(keys)
    try:
        try:
            nodes.open()
        except OSError as exc:
            pytest.skip(f"cannot make network namespaces here: {exc}")
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                nodes.ns[0],
                *NODE_UNSHARE,
                "sh",
                "-c",
                "mount -t tmpfs -o size=1m pixpool-probe /dev/shm",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            pytest.skip(
                f"cannot give a node its own /dev/shm, host name and pids ({' '.join(NODE_UNSHARE)} + tmpfs): {probe.stderr.strip()}"
            )
        for n in (0, 1):
            script = _node_script(
                n, nodes.veth[n], str(synthetic_data.coco_json), dirs[n], record, pid_files[n], keys=keys
            )
            procs.append(_start_node(nodes, n, script, logs[n]))
        _wait_both(procs, NODE_TIMEOUT_S)
        text = [log.read_text() for log in logs]
        assert [p.returncode for p in procs] == [0, 0], "\n\n".join(
            f"node {n} (rc {p.returncode}):\n{t[-3000:]}" for n, (p, t) in enumerate(zip(procs, text))
        )
    finally:
        for p in procs:
            _stop(p)
        nodes.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)

    records = read_records(record)
    assert len(records) == 2 * EPOCHS
    check_each_index_once(records, num_records=RECORDS, epochs=EPOCHS, world_size=2)
    if layout == "tcp-from-node0":
        assert "prepared" in text[0] and not pid_files[1].exists()  # node 1 started no daemon
        daemon = int(pid_files[0].read_text())
        for r in records:
            mine = [n for n, pids in r["segments"].items() if r["pid"] in pids]
            if r["host"] == "pxnode0":  # local: its own ring of the node's daemon
                assert len(mine) == 1 and mine[0].startswith(ring_prefix(daemon)), (r, daemon)
            else:  # remote: frames, no shared memory at all (node 1's /dev/shm is empty)
                assert r["host"] == "pxnode1" and mine == [] and r["segments"] == {}, r
        return
    # Each node prepared its own snapshot: with a shared /dev/shm the second would re-attach the first's.
    for t in text:
        assert "prepared" in t and "re-attached" not in t, t[-2000:]
    # Each rank read batches from a ring of its own node's daemon, and the two ranks of an
    # epoch ran on different nodes (rendezvous decides which node gets which rank; each node
    # has its own host name and pid namespace, so a daemon is known by (host, pid)).
    daemons = {f"pxnode{n}": int(f.read_text()) for n, f in enumerate(pid_files)}
    for epoch in range(EPOCHS):
        of_epoch = [r for r in records if r["epoch"] == epoch]
        assert sorted(r["host"] for r in of_epoch) == sorted(daemons), of_epoch
        for r in of_epoch:
            mine = [n for n, pids in r["segments"].items() if r["pid"] in pids]
            assert len(mine) == 1 and mine[0].startswith(ring_prefix(daemons[r["host"]])), (r["host"], mine, daemons)
