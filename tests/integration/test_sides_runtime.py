"""The sides at run time: a trainer loads no producer code, a serving node runs without torch,
a bad setting fails before anything is decoded, and a daemon's refusal keeps its class.

Integration tests: CLI children (``python -m pixpool.cli``) and spawned daemons,
every one reaped; each wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers.daemon import WAIT_S, free_port, real_daemon, reference_stream, short_socket_dir, small_serve_args
from pixpool.client import Client
from pixpool.client.child import cli_command, serve_child, stop_child, wait_serving
from pixpool.client.options import ClientOptions
from pixpool.server.readers import load_dataset
from pixpool.server.snapshot.fingerprint import base_name, fingerprint
from pixpool.shared.errors import CapacityError, ConfigError
from pixpool.shared.stream.config import AugmentConfig, StreamSettings
from pixpool.shared.transport.store import DEFAULT

IMGSZ = 96


def test_a_trainer_process_loads_no_producer_code():
    code = textwrap.dedent("""
        import sys
        import pixpool.client.client, pixpool.client.delivery, pixpool.cli.digest
        print([m for m in sys.modules if m.startswith("pixpool.server") or m in ("cv2", "torch", "pycocotools")])
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT_S, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.fixture
def no_torch_env(tmp_path) -> dict:
    """An environment in which ``import torch`` fails, as on a serving node without the extra."""
    site = tmp_path / "no_torch"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent("""
        import sys

        class _NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError("No module named 'torch'", name="torch")
                return None

        sys.meta_path.insert(0, _NoTorch())
    """)
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_serve_and_digest_without_torch(synthetic_data, no_torch_env):
    torch_check = subprocess.run(
        [sys.executable, "-c", "import torch"], env=no_torch_env, capture_output=True, text=True, timeout=WAIT_S
    )
    assert torch_check.returncode != 0 and "No module named 'torch'" in torch_check.stderr
    settings = StreamSettings(seed=5, batch_size=4, augment=AugmentConfig(imgsz=IMGSZ))
    expected = reference_stream(load_dataset(synthetic_data.coco_json), settings, 0)[0][:3]
    before = set(DEFAULT.segments())
    d = short_socket_dir()
    serve = subprocess.Popen(
        cli_command("serve", *small_serve_args(synthetic_data.coco_json, d, IMGSZ)),
        env=no_torch_env,
    )
    try:
        wait_serving(serve, d, timeout_s=WAIT_S)
        digest = subprocess.run(
            cli_command(
                "digest",
                str(synthetic_data.coco_json),
                "--socket-dir",
                d,
                "--seed",
                "5",
                "--batch-size",
                "4",
                "--imgsz",
                str(IMGSZ),
                "--batches",
                "3",
                "--json",
            ),
            env=no_torch_env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        assert digest.returncode == 0, digest.stderr
        assert json.loads(digest.stdout)["digests"] == expected
        train = subprocess.run(
            cli_command("train", "--socket-dir", d, "--imgsz", str(IMGSZ), "--max-steps", "1"),
            env=no_torch_env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
        assert train.returncode == 1 and "pip install 'pixpool[train]'" in train.stderr, train.stderr
    finally:
        assert stop_child(serve, timeout_s=WAIT_S) == 0
        shutil.rmtree(d, ignore_errors=True)
    assert set(DEFAULT.segments()) - before == set()


@pytest.mark.parametrize(
    "problem",
    [
        "tcp without keys",
        "keys without a server key",
        "socket dir others can enter",
        "socket dir in use",
        "socket dir a dangling symlink",
    ],
)
def test_bad_serve_settings_fail_before_any_decoding(synthetic_data, tmp_path, problem):
    d = short_socket_dir()
    argv = small_serve_args(synthetic_data.coco_json, d, IMGSZ)
    expect = {
        "tcp without keys": "requires CURVE keys",
        "keys without a server key": "server.key_secret is missing",
        "socket dir others can enter": "open to other users",
        "socket dir in use": "already serves",
        "socket dir a dangling symlink": "is a symbolic link (to /nonexistent/pixpool-sock, which does not exist)",
    }[problem]
    other = None
    if problem == "tcp without keys":
        argv += ["--tcp", f"127.0.0.1:{free_port()}"]
    elif problem == "keys without a server key":
        (tmp_path / "keys").mkdir()
        argv += ["--tcp", f"127.0.0.1:{free_port()}", "--keys", str(tmp_path / "keys")]
    elif problem == "socket dir others can enter":
        os.chmod(d, 0o755)
    elif problem == "socket dir a dangling symlink":
        os.symlink("/nonexistent/pixpool-sock", os.path.join(d, "link"))
        argv[-1] = os.path.join(d, "link")
    else:
        other = serve_child(argv[:-2], socket_dir=d, timeout_s=WAIT_S)
        other.__enter__()
    before = set(DEFAULT.segments())
    try:
        proc = subprocess.run(cli_command("serve", *argv), capture_output=True, text=True, timeout=WAIT_S)
        assert proc.returncode == 1, proc.stderr
        assert expect in proc.stderr
        # Nothing made, nothing decoded: a fresh snapshot would be in /dev/shm by now.
        base = base_name(fingerprint(load_dataset(synthetic_data.coco_json), imgsz=IMGSZ))
        assert not [n for n in set(DEFAULT.segments()) - before if n.startswith(base)]
    finally:
        if other is not None:
            other.__exit__(None, None, None)
        shutil.rmtree(d, ignore_errors=True)


def test_daemon_refusals_arrive_as_their_class(synthetic_data):
    s = StreamSettings(seed=1, batch_size=2, augment=AugmentConfig(imgsz=160))
    with real_daemon(synthetic_data.coco_json, imgsz=160, workers=1, max_total_ring_nbytes=1) as (_, d):
        with pytest.raises(CapacityError, match="exceeds the daemon's ring budget of 1 bytes"):
            Client.connect(s, ClientOptions(socket_dir=d, timeout_s=WAIT_S))
        with pytest.raises(ConfigError, match="asks for imgsz 320 but the daemon serves imgsz 160") as info:
            Client.connect(
                StreamSettings(augment=AugmentConfig(imgsz=320)), ClientOptions(socket_dir=d, timeout_s=WAIT_S)
            )
        assert info.value.field == "imgsz"
