"""The run's secret and the sampler servers' handshake against outsiders and squatters: an outsider's pickle
is never unpickled, a peer with the wrong secret is dropped and the run goes on bitwise, a squatter on a server's
port is detected (the trainers' handshake; the server's own bind) and the run fails with exit 1 and one line.
(The sharper attacker, who relays or binds a port first: test_trust.py.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import DATA_ROOT, TINY, Marker, free_port, run_cli, squat, summary_of

from hpcgnn import trust
from hpcgnn.errors import ConfigError, PortTaken, SamplerFailed, Untrusted


def _outsider_pickle(marker) -> bytes:
    payload = pickle.dumps(("hello", 0, Marker(marker), 1, None))
    return len(payload).to_bytes(8, "big") + (0).to_bytes(8, "big") + payload  # the servers' framing, as it was


def test_the_runs_secret_is_private_to_its_owner_and_refused_otherwise(tmp_path):
    key = trust.run_secret(tmp_path)
    path = tmp_path / ".secret"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert trust.run_secret(tmp_path) == key  # every process of the run reads the same
    assert trust.run_secret(tmp_path / "other") != key  # another run, another secret
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"the run's secret .*\.secret can be read or written by others \(mode 0644\)\. "
                                          r"HINT: remove it and use a run folder only you can write"):
        trust.run_secret(tmp_path)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"the run's secret .*\.secret is a symbolic link, which hpcgnn does not "
                                          r"follow\. HINT: another user may have planted it: remove it"):
        trust.run_secret(tmp_path)
    path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not a secret")
    os.close(fd)
    with pytest.raises(ConfigError, match=r"is not 64 hex digits"):
        trust.run_secret(tmp_path, wait_s=0.2)


def _handshake(server_key: bytes, client_key: bytes):
    """Both sides of one handshake over a socket pair: (the listener's outcome, the connecting side's)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    outcome: dict = {}

    def listen():
        a, _ = listener.accept()
        try:
            trust.accept(a, server_key, 0, port, timeout_s=5)
            outcome["server"] = "ok"
        except trust.PeerRefused as exc:
            outcome["server"] = exc
        finally:
            a.close()

    t = threading.Thread(target=listen)
    t.start()
    b = socket.create_connection(("127.0.0.1", port))
    try:
        trust.connect(b, client_key, f"sampler server 0 at 127.0.0.1:{port}", 0, port, 0, timeout_s=5)
        client = "ok"
    except Untrusted as exc:
        client = exc
    finally:
        t.join()
        b.close()
        listener.close()
    return outcome["server"], client


def test_the_handshake_proves_the_secret_in_both_directions():
    key = os.urandom(32)
    assert _handshake(key, key) == ("ok", "ok")
    server, client = _handshake(key, os.urandom(32))
    assert isinstance(server, trust.PeerRefused) and "does not know the run's secret" in str(server)
    assert isinstance(client, Untrusted) and re.search(r"sampler server 0 at 127.0.0.1:\d+ (broke off|failed) the run's "
                                                       r"handshake", str(client))


@pytest.fixture
def lone_server(tmp_path, caplog):
    """A sampler server in a thread of this process on a free loopback port, waiting for one trainer (none comes:
    it gives up after 3 s); yields (port, key)."""

    from hpcgnn.sampling.server import run_server

    port, key, threads = free_port(), os.urandom(32), torch.get_num_threads()
    ended: list = []

    def serve():
        try:
            run_server(0, port, 1, threads, str(tmp_path / "run"), key, None, host="127.0.0.1", idle_s=3.0)
        except SamplerFailed as exc:
            ended.append(exc)

    caplog.set_level(logging.INFO, logger="hpcgnn")
    logging.getLogger("hpcgnn").propagate = True
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "run" / "metrics" / "sampler-server-0.json").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    yield port, key
    t.join(30)
    assert ended and "no trainer for 3 s" in str(ended[0])  # it served on after every refused peer
    torch.set_num_threads(threads)


def test_an_outsiders_pickle_is_never_unpickled_and_the_server_serves_on(lone_server, tmp_path, caplog):
    port, key = lone_server
    marker = tmp_path / "owned"
    for read_greeting in (False, True):
        time.sleep(1.05)  # (refusals are logged once a second per address)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            if read_greeting:
                assert s.recv(len(trust.MAGIC)) == trust.MAGIC
            s.sendall(_outsider_pickle(marker))
            with contextlib.suppress(ConnectionResetError):
                while s.recv(4096):  # the server closes it
                    pass
    time.sleep(1.05)
    with socket.create_connection(("127.0.0.1", port)) as s:  # a peer with another secret
        with pytest.raises(Untrusted, match=rf"sampler server 0 at 127.0.0.1:{port} (broke off|failed) the run's "
                                            "handshake"):
            trust.connect(s, os.urandom(32), f"sampler server 0 at 127.0.0.1:{port}", 0, port, 0)
    with socket.create_connection(("127.0.0.1", port)) as s:  # the run's own trainer passes
        trust.connect(s, key, "sampler server 0", 0, port, 0)
    time.sleep(0.5)
    assert not marker.exists()
    # (each record once: caplog at the root can hold one record twice where an earlier test of the worker left a
    # handler doubled, as tests/test_trust.py saw in CI)
    records = list({id(r): r for r in caplog.records}.values())
    refused = [r.getMessage() for r in records if "refused a connection" in r.getMessage()]
    assert len(refused) == 3 and all(re.search(r"refused a connection from 127\.0\.0\.1:\d+: ", m) for m in refused), refused


def _squat(port: int, greeting: bytes | None, stop: threading.Event) -> None:
    """Another user's process listening on ``port`` first: it greets every connection with ``greeting`` (None:
    says nothing) and reads what it is sent."""

    def handle(conn: socket.socket) -> None:
        with conn:
            if greeting is not None:
                conn.sendall(greeting)
            conn.settimeout(1)
            try:
                conn.recv(1 << 16)
            except OSError:
                pass

    squat(port, handle, stop)


@pytest.mark.parametrize("greeting", [trust.MAGIC + os.urandom(32), b"SSH-2.0-OpenSSH_9.2\r\n" + bytes(32), None],
                         ids=["imitating", "another-service", "silent"])
def test_a_trainer_detects_a_squatter_on_its_servers_port(greeting, tmp_path, monkeypatch):
    from hpcgnn.sampling import client

    monkeypatch.setattr(trust, "HANDSHAKE_S", 1.0)
    port, stop = free_port(), threading.Event()
    _squat(port, greeting, stop)
    t0 = time.monotonic()
    try:
        with pytest.raises(Untrusted, match=rf"sampler server 0 at 127.0.0.1:{port} (did not greet as a sampler server|"
                                            rf"failed the run's handshake|did not complete the run's handshake within "
                                            rf"1 s|broke off the run's handshake .*): the process listening on port "
                                            rf"{port} of 127.0.0.1 is not this run's .* HINT: start the run again"):
            client._connect("127.0.0.1", port, 0, 60, os.urandom(32), tmp_path)
    finally:
        stop.set()
    assert time.monotonic() - t0 < 10


def test_a_server_whose_port_is_taken_says_so_inone_line(tmp_path):
    from hpcgnn.sampling.server import run_server

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(PortTaken, match=rf"sampler server 0 on \S+:{port} cannot listen: port {port} of 127.0.0.1 "
                                            r"is taken by another process .* HINT: start the run again"):
            run_server(0, port, 1, 1, str(tmp_path), os.urandom(32), None, host="127.0.0.1")


@pytest.mark.slow
def test_a_squatter_fails_a_local_run_with_exit_1_andone_line(tmp_path):
    port, stop = free_port(), threading.Event()
    _squat(port, trust.MAGIC + os.urandom(32), stop)
    try:
        t0 = time.monotonic()
        res = run_cli(*TINY, "launch.procs=1", "launch.sampler_servers=1", f"debug.server_port={port}",
                      "metrics.tensorboard=false", cwd=tmp_path, timeout=120)
    finally:
        stop.set()
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert re.match(rf"hpcgnn: (port taken|security): sampler server 0 .*port {port}\b.*HINT: ", lines[0]), lines[0]
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_outsiders_during_a_run_are_dropped_and_the_run_ends_bitwise(tmp_path):
    """A trainer and a sampler server; while they train, an outsider sends the server a pickle and a peer with
    another secret knocks: both are refused (the server logs their addresses), nothing is unpickled, and the run
    ends with the parameters of in-process sampling."""
    args = [*TINY, "train.epochs=6", "launch.procs=1", "train.num_threads=1", "metrics.tensorboard=false",
            f"dataset.root={DATA_ROOT}"]
    plain = run_cli(*args, cwd=tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    folder, marker = tmp_path / "served", tmp_path / "owned"
    folder.mkdir()
    log = folder / "out.txt"
    child = subprocess.Popen([sys.executable, "-m", "hpcgnn", *args, "launch.sampler_servers=1",
                              f"hydra.run.dir={folder / 'run'}"], stdout=log.open("w"), stderr=subprocess.STDOUT,
                             cwd=folder, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    info = folder / "run" / "metrics" / "sampler-server-0.json"
    deadline = time.monotonic() + 120
    while not info.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    port = json.loads(info.read_text())["port"]
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(_outsider_pickle(marker))
    with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) as s, \
            pytest.raises(Untrusted):  # (from another address: refusals are logged once a second per address)
        trust.connect(s, os.urandom(32), "sampler server 0", 0, port, 0)
    assert child.wait(timeout=180) == 0, log.read_text()
    out = log.read_text()
    assert len(re.findall(r"\[server 0\] sampler server 0 on \S+: refused a connection from 127\.0\.0\.[12]:\d+: ", out)) == 2, out
    assert not marker.exists()
    assert summary_of(folder)["param_checksums"] == summary_of(tmp_path / "plain")["param_checksums"]
