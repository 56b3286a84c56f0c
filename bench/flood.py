"""bench/flood.py: how long a TCP trainer's attach and a metrics scrape take under a flood of idle connections, against no flood.

Runs in one process (the measurer, which also holds the flood's sockets, from a thread); the
daemon runs in a spawned process of its own: the synthetic set at imgsz 160, one worker,
``--tcp`` on 127.0.0.1 with CURVE keys, ``--metrics-port``.

In alternating rounds, paired: ``attach``, seconds from ``Client.connect`` over
``tcp://...`` to its attach answered, without a flood and while 32 idle connections from each of 40 loopback
addresses (127.0.0.10-49; past the handshake guard's cap of 1,024 in all) are held and opened
again as the daemon ends them; ``scrape``, seconds for one ``GET /metrics`` answered in full,
without a flood and while ``--idle`` idle connections from 127.0.0.2 are held open. A flood
arm starts its flood, waits until it holds (the guard refused the excess; the idle
connections are connected), measures once and closes the flood.

    python bench/flood.py [--rounds 5] [--idle 64]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # the helpers beside this file, under python -P too
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

# The flood helpers of the tests (loopback only, every socket closed with linger 0).
sys.path.insert(0, str(common.ROOT / "tests"))
from helpers.flood import HeldFlood, IdleFlood, raise_own_nofile  # noqa: E402

SOURCES = [f"127.0.0.{i}" for i in range(10, 50)]
PER_ADDRESS = 32
TOTAL_CAP = 1024
ATTACH_TIMEOUT_S = 60.0
SCRAPE_TIMEOUT_S = 60.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _refused(socket_dir: str) -> int:
    from pixpool.ops.status_client import query_status

    return query_status(socket_dir, timeout_s=5.0).daemon.tcp_handshakes_refused


def _attach_s(port: int, keys: Path) -> float:
    from pixpool.client import Client
    from pixpool.client.options import ClientOptions
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings

    settings = StreamSettings(seed=3, batch_size=4, augment=AugmentConfig(imgsz=160))
    t0 = time.perf_counter()
    with Client.connect(
        settings, ClientOptions(endpoint=f"tcp://127.0.0.1:{port}", keys_dir=keys, timeout_s=ATTACH_TIMEOUT_S)
    ):
        return time.perf_counter() - t0


def _scrape_s(port: int) -> float:
    import urllib.request

    t0 = time.perf_counter()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S).read()
    took = time.perf_counter() - t0
    if b"pixpool_" not in body:
        raise RuntimeError(f"the scrape's body holds no pixpool metric: {body[:200]!r}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__, "flood.py")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (pairs)")
    p.add_argument("--idle", type=int, default=64, help="idle connections held against the metrics endpoint")
    args = p.parse_args(argv)
    if not raise_own_nofile(len(SOURCES) * PER_ADDRESS + args.idle + 512):
        raise SystemExit("the hard RLIMIT_NOFILE is too low for the flood; raise it (ulimit -Hn)")
    from pixpool.server.synthetic import write_synthetic
    from pixpool.shared.transport.endpoint import write_keys

    root = Path(tempfile.mkdtemp(prefix="pxflood-"))
    try:
        data = write_synthetic(root / "synthetic", num_images=24, seed=0)
        keys = root / "keys"
        write_keys(keys)
        tcp_port, metrics_port = _free_port(), _free_port()
        fields = dict(data=str(data.coco_json), imgsz=160, processes=1, tcp=f"127.0.0.1:{tcp_port}")
        with common.daemon(workers=1, keys_dir=str(keys), metrics_port=metrics_port, **fields) as (d, _):

            def attach_flooded() -> float:
                before = _refused(d)
                excess = len(SOURCES) * PER_ADDRESS - TOTAL_CAP
                with HeldFlood("127.0.0.1", tcp_port, SOURCES, PER_ADDRESS):
                    deadline = time.monotonic() + 60.0
                    while _refused(d) - before < excess:
                        if time.monotonic() > deadline:
                            raise RuntimeError("the flood did not reach the guard's cap within 60 s")
                        time.sleep(0.1)  # polling interval of a bounded wait
                    return _attach_s(tcp_port, keys)

            def scrape_flooded() -> float:
                with IdleFlood() as flood:
                    flood.open("127.0.0.1", metrics_port, args.idle, source="127.0.0.2")
                    return _scrape_s(metrics_port)

            arms = {
                "attach": lambda: _attach_s(tcp_port, keys),
                "attach, flood": attach_flooded,
                "scrape": lambda: _scrape_s(metrics_port),
                f"scrape, {args.idle} idle": scrape_flooded,
            }
            load_before = common.load()
            got = common.rounds(arms, args.rounds, rotate=True, warmup=True)
            load_after = common.load()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [[name, f"{statistics.median(v):.3f}", common.runs(v, ".3f")] for name, v in got.items()]
    print(common.table(["arm", "median s", "each round, s"], rows))
    names = list(got)
    print(f"\nattach, flood / attach: {common.paired(got[names[1]], got[names[0]])}")
    print(f"scrape, idle / scrape: {common.paired(got[names[3]], got[names[2]])}")
    print(f"load before {load_before}, after {load_after}; command: {args.command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
