"""A daemon refuses, at start and by file and line, a label value that would make every
attach fail.

Integration test: ``pixpool serve`` in a subprocess on a copy of the synthetic set read as
an images folder (no class names), one label line with class id 1,000,000. Before the fix
the daemon started, its health probe passed, and every attach failed on the client's side
(``frame of 6889338 bytes exceeds the limit of 4194304 bytes``): the ``attached`` reply
carried a million class names. Now ``serve`` exits non-zero before any segment is made,
naming the label file, the line and ``--max-classes`` (nothing is prepared: the conftest's
end-of-run check finds no segment left).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from helpers.daemon import WAIT_S, short_socket_dir

IMGSZ = 64


def _serve(folder, socket_dir: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pixpool.cli", "serve", str(folder), "--imgsz", str(IMGSZ), "--workers", "1",
           "--processes", "1", "--socket-dir", socket_dir, *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _what_an_attach_gets(socket_dir: str) -> str:
    from pixpool.client import Client
    from pixpool.client.options import ClientOptions
    from pixpool.shared.errors import PixpoolError
    from pixpool.shared.stream.config import AugmentConfig, StreamSettings

    settings = StreamSettings(batch_size=4, augment=AugmentConfig(mosaic=0.0))
    try:
        with Client.connect(settings, ClientOptions(socket_dir=socket_dir, timeout_s=WAIT_S)) as c:
            return f"attached with {len(c.names)} class names"
    except PixpoolError as exc:  # what the trainer sees is the point
        return f"{type(exc).__name__}: {exc}"


def test_serve_refuses_a_class_id_over_the_bound_by_file_and_line(synthetic_copy):
    label = synthetic_copy / "labels" / "train" / "synth_0004.txt"
    label.write_text("0 0.5 0.5 0.2 0.2\n1000000 0.5 0.5 0.1 0.1\n")
    d = short_socket_dir()
    proc = _serve(synthetic_copy / "images" / "train", d)
    try:
        try:
            out, _ = proc.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the daemon started and serves; an attach: {_what_an_attach_gets(d)}") from None
        assert proc.returncode != 0, out
        assert f"{label}:2: class id 1000000" in out and "--max-classes" in out, out
        assert "snapshot" not in out, out  # refused while reading, before anything was prepared
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
        shutil.rmtree(d, ignore_errors=True)


def test_serve_with_max_classes_raised_serves_the_classes(synthetic_copy):
    """The bound is a setting: raised past the id, the daemon serves and an attach gets every name."""
    label = synthetic_copy / "labels" / "train" / "synth_0004.txt"
    label.write_text("0 0.5 0.5 0.2 0.2\n30000 0.5 0.5 0.1 0.1\n")
    d = short_socket_dir()
    proc = _serve(synthetic_copy / "images" / "train", d, "--max-classes", "30001")
    try:
        from helpers.daemon import ask_status, wait_for

        wait_for(lambda: proc.poll() is not None or ask_status(d, 1.0), WAIT_S, "pixpool serve up")
        assert proc.poll() is None, proc.communicate(timeout=WAIT_S)[0]
        assert _what_an_attach_gets(d) == "attached with 30001 class names"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=WAIT_S)
        shutil.rmtree(d, ignore_errors=True)
