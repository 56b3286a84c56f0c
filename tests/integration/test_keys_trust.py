"""The CURVE key directory decides who is served over TCP: both sides refuse keys that
someone else could change, by the same rule as the socket directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.daemon import WAIT_S, short_socket_dir
from helpers.users import as_user
from pixpool.client.child import cli_command
from pixpool.shared.errors import ConfigError
from pixpool.shared.transport.endpoint import check_keys_dir, check_server_keys, write_keys


@pytest.fixture
def keys(tmp_path):
    write_keys(tmp_path / "keys")
    return tmp_path / "keys"


def _drop_key(authorized) -> None:
    import zmq.auth

    zmq.auth.create_certificates(str(authorized), "intruder")


@pytest.fixture
def reachable_keys():
    """Keys in a folder the other user can reach (pytest's tmp_path is private to root)."""
    top = tempfile.mkdtemp(prefix="pxkeys-", dir="/tmp")
    os.chmod(top, 0o711)
    try:
        write_keys(os.path.join(top, "keys"))
        yield Path(top) / "keys"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_serve_refuses_a_world_writable_authorized_folder_with_a_key_dropped_in(
    other_user, reachable_keys, synthetic_data
):
    """The attack: with authorized/ world-writable, another user adds a client key; the
    daemon refuses to start instead of serving that user over TCP."""
    keys = reachable_keys
    authorized = keys / "authorized"
    os.chmod(authorized, 0o777)
    os.chmod(keys, 0o711)  # the other user must reach authorized/ to drop the key
    as_user(other_user, _drop_key, str(authorized))
    assert (authorized / "intruder.key").stat().st_uid == other_user.uid
    d = short_socket_dir()
    try:
        proc = subprocess.run(
            cli_command(
                "serve",
                str(synthetic_data.coco_json),
                "--imgsz",
                "64",
                "--workers",
                "1",
                "--processes",
                "1",
                "--socket-dir",
                d,
                "--tcp",
                "127.0.0.1:1",
                "--keys",
                str(keys),
            ),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert proc.returncode == 1
    assert f"key directory {authorized} is writable by group or others" in proc.stderr and "mode 0777" in proc.stderr
    os.chmod(authorized, 0o700)  # writable by us alone again: the intruder's key is still someone else's
    with pytest.raises(ConfigError, match=rf"key file {authorized / 'intruder.key'} belongs to uid {other_user.uid}"):
        check_server_keys(keys)


def test_a_key_directory_of_another_user_is_refused(other_user, keys):
    os.chown(keys, other_user.uid, other_user.gid)
    with pytest.raises(ConfigError, match=rf"key directory {keys} belongs to uid {other_user.uid}, not to you"):
        check_server_keys(keys)


@pytest.mark.parametrize("secret", ["server.key_secret", "client.key_secret"])
def test_a_secret_key_others_can_read_is_refused(keys, secret):
    os.chmod(keys / secret, 0o644)
    with pytest.raises(
        ConfigError,
        match=rf"secret key file {keys / secret} is readable or writable by others \(mode 0644\); run `chmod 600",
    ):
        check_keys_dir(keys, secret=secret)


def test_keys_written_under_a_loose_umask_pass(tmp_path):
    old = os.umask(0o002)
    try:
        write_keys(tmp_path / "k")
    finally:
        os.umask(old)
    check_server_keys(tmp_path / "k")
    check_keys_dir(tmp_path / "k", secret="client.key_secret")


def test_the_client_refuses_loose_keys(keys):
    import zmq

    from pixpool.shared.transport.endpoint import configure_client

    os.chmod(keys / "server.key", 0o666)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        with pytest.raises(ConfigError, match=r"server.key is writable by group or others"):
            configure_client(sock, keys)
    finally:
        sock.close(linger=0)
