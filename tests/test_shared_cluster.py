"""A shared cluster, tried as a careless and as a hostile user would (issue 44's list), each case kept as a regression
beside test_hostile.py. Every port is reachable by every user of the cluster, who can derive it from the job id.

1. Sampler servers act on no byte before the peer proved it knows the run's secret: an outsider's pickle is never
   unpickled, a peer with the wrong secret is dropped and the run goes on bitwise.
2. A squatter on a server's port is detected (the trainers' handshake; the server's own bind) and the run fails
   with exit 1 and one line naming the port.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, TINY, run_cli, summary_of, train_here

from hpcgnn import trust
from hpcgnn.errors import ConfigError, DatasetError, PortTaken, SamplerFailed, Untrusted
from hpcgnn.sampling.kernels import binding


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Marker:
    """Unpickling this creates ``path``: what an outsider's pickle would do to whoever loads it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _outsider_pickle(marker) -> bytes:
    payload = pickle.dumps(("hello", 0, _Marker(marker), 1, None))
    return len(payload).to_bytes(8, "big") + (0).to_bytes(8, "big") + payload  # the servers' framing, as it was


# ------------------------------------------------------------------ 1. the run's secret and the handshake


def test_1_the_runs_secret_is_private_to_its_owner_and_refused_otherwise(tmp_path):
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
    with pytest.raises(ConfigError, match=r"cannot read the run's secret .* HINT: it must be a plain file of yours"):
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


def test_1_the_handshake_proves_the_secret_in_both_directions():
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
    import torch

    from hpcgnn.sampling.server import run_server

    port, key, threads = _free_port(), os.urandom(32), torch.get_num_threads()
    ended: list = []

    def serve():
        try:
            run_server(0, port, 1, threads, str(tmp_path / "run"), key, host="127.0.0.1", idle_s=3.0)
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


def test_1_an_outsiders_pickle_is_never_unpickled_and_the_server_serves_on(lone_server, tmp_path, caplog):
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
    refused = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refused) == 3 and all(re.search(r"refused a connection from 127\.0\.0\.1:\d+: ", m) for m in refused), refused


def _squat(port: int, greeting: bytes | None, stop: threading.Event) -> threading.Thread:
    """Another user's process listening on ``port`` first: it greets every connection with ``greeting`` (None:
    says nothing) and reads what it is sent."""
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(0.2)

    def run():
        with listener:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    if greeting is not None:
                        conn.sendall(greeting)
                    conn.settimeout(1)
                    try:
                        conn.recv(1 << 16)
                    except OSError:
                        pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("greeting", [trust.MAGIC + os.urandom(32), b"SSH-2.0-OpenSSH_9.2\r\n" + bytes(32), None],
                         ids=["imitating", "another-service", "silent"])
def test_2_a_trainer_detects_a_squatter_on_its_servers_port(greeting, tmp_path, monkeypatch):
    from hpcgnn.sampling import server

    monkeypatch.setattr(trust, "HANDSHAKE_S", 1.0)
    port, stop = _free_port(), threading.Event()
    _squat(port, greeting, stop)
    t0 = time.monotonic()
    try:
        with pytest.raises(Untrusted, match=rf"sampler server 0 at 127.0.0.1:{port} (did not greet as a sampler server|"
                                            rf"failed the run's handshake|did not complete the run's handshake within "
                                            rf"1 s|broke off the run's handshake .*): the process listening on port "
                                            rf"{port} of 127.0.0.1 is not this run's .* HINT: start the run again"):
            server._connect("127.0.0.1", port, 0, 60, os.urandom(32), tmp_path)
    finally:
        stop.set()
    assert time.monotonic() - t0 < 10


def test_2_a_server_whose_port_is_taken_says_so_in_one_line(tmp_path):
    from hpcgnn.sampling.server import run_server

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(PortTaken, match=rf"sampler server 0 on \S+:{port} cannot listen: port {port} of 127.0.0.1 "
                                            r"is taken by another process .* HINT: start the run again"):
            run_server(0, port, 1, 1, str(tmp_path), os.urandom(32), host="127.0.0.1")


@pytest.mark.slow
def test_2_a_squatter_fails_a_local_run_with_exit_1_and_one_line(tmp_path):
    port, stop = _free_port(), threading.Event()
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
def test_1_outsiders_during_a_run_are_dropped_and_the_run_ends_bitwise(tmp_path):
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



# ------------------------------------------------------------------ 3. what a local run listens on


def _listening(pids: set[int]) -> set[str]:
    """host:port of every TCP socket these processes listen on (from /proc)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    out = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                    continue
                hexaddr, hexport = fields[1].split(":")
                raw = bytes.fromhex(hexaddr)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian words
                out.add(f"{socket.inet_ntop(family, raw)}:{int(hexport, 16)}")
    return out


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo.extend(children.get(p, []))
    return out


@pytest.mark.slow
def test_3_a_local_run_listens_on_loopback_only(tmp_path):
    """Two ranks and a sampler server: the rendezvous store, gloo's pairs and the server all listen on 127.0.0.1."""
    log = tmp_path / "out.txt"
    child = subprocess.Popen([sys.executable, "-m", "hpcgnn", *TINY, "train.epochs=20", "launch.sampler_servers=1",
                              "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", f"hydra.run.dir={tmp_path / 'run'}"],
                             stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path,
                             env={k: v for k, v in {**os.environ, "PYTHONUNBUFFERED": "1"}.items()
                                  if k != "GLOO_SOCKET_IFNAME"})
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while child.poll() is None and time.monotonic() < deadline:
        if "epoch 2/20" in log.read_text():
            seen |= _listening(_descendants(child.pid))
        time.sleep(0.05)
    assert child.wait(timeout=120) == 0, log.read_text()
    assert len(seen) >= 3, (seen, log.read_text())  # the store, a gloo pair or more, the server
    assert all(addr.startswith("127.0.0.1:") for addr in seen), seen


def test_3_a_server_listens_where_its_trainers_reach_it():
    from hpcgnn.sampling.server import bind_address

    hosts = {"n1": "10.0.0.1", "n2": "10.0.0.2", "dev1": "127.0.0.1", "dev2": "127.0.0.1", "deb": "127.0.1.1"}

    def resolve(name):
        try:
            return hosts[name]
        except KeyError:
            raise socket.gaierror(name) from None

    assert bind_address("n2", ["n1"], resolve) == "10.0.0.2"  # the node's own address, not every interface
    assert bind_address("dev2", ["dev1"], resolve) == "127.0.0.1"  # one machine (the dev cluster): loopback
    assert bind_address("deb", ["n1"], resolve) == ""  # Debian's 127.0.1.1 for itself: the trainers reach it elsewhere
    assert bind_address("deb", [], resolve) == ""
    assert bind_address("unknown", ["n1"], resolve) == ""


# ------------------------------------------------------------------ 4. the C kernels' library


needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here to make the libraries")


def _cc(tmp_path, name: str, source: str, *flags: str) -> Path:
    """A shared library compiled from ``source`` (C text)."""
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-pthread", *flags, str(c), "-o", str(out)], check=True)
    return out


def _unity() -> str:
    """C text that compiles every source of the kernels as one file."""
    from hpcgnn.sampling.kernels import sources

    return "".join(f'#include "{path}"\n' for path in sources.SOURCES)


def _lying(tmp_path) -> Path:
    """The kernels of this very source (the right hash) whose row gathers write zeros: only the self-test tells."""
    from hpcgnn.sampling.kernels import build

    return _cc(tmp_path, "lying", _unity() +
               "int64_t lying_gather(const void *s, int64_t r, int64_t b, const int64_t *i, int64_t n, void *o,\n"
               "                     const int64_t *a, int64_t c, int64_t *sc, int t, void *j) {\n"
               "    int64_t res = hpcgnn_gather_rows(s, r, b, i, n, o, a, c, sc, t, j);\n"
               "    memset(o, 0, (size_t)(n * b)); return res; }\n",
               f'-DHPCGNN_SOURCE_HASH="{build.source_hash()}"', "-Dhpcgnn_gather_rows=hidden_gather",
               "-Wl,--defsym=hpcgnn_gather_rows=lying_gather")


@pytest.fixture
def kernels_with(monkeypatch, tmp_path, caplog):
    """``kernels_with(packaged=PATH|None, cache=FOLDER, cc=NAME|None)``: (the kernels this process then loads, the
    warnings it logged), and checks that they (or torch ops) make the torch ops' batches."""
    from hpcgnn.config import DatasetConfig
    from hpcgnn.data import build_graph
    from hpcgnn.sampling import CSRNeighborSampler
    from hpcgnn.sampling.kernels import build

    graph = build_graph(DatasetConfig(num_nodes=2000, avg_degree=30, seed=1))

    def batch():
        out = CSRNeighborSampler(graph.rowptr, graph.col, (15, 5)).sample(torch.arange(0, 2000, 3),
                                                                         torch.Generator().manual_seed(2))
        return out.edge_index, out.n_id

    monkeypatch.setenv("HPCGNN_NATIVE", "0")
    binding.kernels.cache_clear()
    want = batch()

    def load(packaged=None, cache=None, cc=None):
        monkeypatch.setattr(build, "packaged", lambda: packaged)
        monkeypatch.setenv("HPCGNN_NATIVE_CACHE", str(cache or tmp_path / "cache"))
        monkeypatch.delenv("HPCGNN_NATIVE")
        if cc is not None:
            monkeypatch.setenv("CC", cc)
        binding.kernels.cache_clear()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hpcgnn"):
            lib = binding.kernels()
            got = batch()
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        monkeypatch.setenv("HPCGNN_NATIVE", "0")
        return lib, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    yield load
    binding.kernels.cache_clear()


@needs_cc
def test_4_a_library_planted_in_the_package_is_refused_and_the_sources_own_used(kernels_with, tmp_path):
    from hpcgnn.sampling.kernels import sources

    planted = _cc(tmp_path, "planted", "long hpcgnn_hop_plan(void) { return 0; }\n")
    sources.record_hash(planted)  # (planted with its hash: the symbols still tell)
    lib, said = kernels_with(packaged=planted)
    assert lib is not None and len(said) == 1, said
    assert re.search(rf"the installed library {planted} is not this source's \(it lacks hpcgnn_hop_fill, .*\): not "
                     r"used; using the ones built into the cache instead", said[0]), said


@needs_cc
@pytest.mark.parametrize("kind", ["stale", "lying", "truncated"])
def test_4_a_wrong_library_in_the_cache_is_never_used(kind, kernels_with, tmp_path):
    """At the cache's own path: one built from an older source, one of this source whose gathers write zeros (the
    'test accuracy 1.0000' case), one cut short (a full disk, a killed copy: SIGBUS when loaded): each is built
    again, with one warning naming it, and the batches are the torch ops'."""
    from hpcgnn.sampling.kernels import build

    cache = tmp_path / "cache"
    path = build.build(cache)
    good = path.read_bytes()
    bad = {"stale": lambda: _cc(tmp_path, "stale", _unity(), '-DHPCGNN_SOURCE_HASH="0123456789abcdef"')
           .read_bytes(), "lying": lambda: _lying(tmp_path).read_bytes(), "truncated": lambda: good[: len(good) // 2]}
    path.unlink()
    path.write_bytes(bad[kind]())
    if kind != "truncated":  # (with its hash recorded, as its builder would: what is inside still tells)
        build.sources.record_hash(path)
    lib, said = kernels_with(cache=cache)
    assert lib is not None and len(said) == 1, said
    why = {"stale": r"built from source 0123456789abcdef, not this one", "lying": r"its row gather does not copy the "
           r"rows torch copies \(self-test\)", "truncated": r"truncated: (its headers reach|a segment ends)"}[kind]
    assert str(path) in said[0] and re.search(why, said[0]), said
    assert build.load(path) is not None  # the one built in its place


@needs_cc
def test_4_a_cut_short_library_without_a_compiler_ends_on_torch_ops_with_one_warning(kernels_with, tmp_path):
    from hpcgnn.sampling.kernels import build

    cache = tmp_path / "cache"
    path = build.build(cache)
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 3])
    lib, said = kernels_with(cache=cache, cc="no-such-cc")
    assert lib is None and len(said) == 1, said
    assert f"{path} is not this source's (truncated" in said[0] and "no C compiler 'no-such-cc'" in said[0]


@needs_cc
def test_4_without_a_compiler_a_library_built_here_before_is_used(kernels_with, tmp_path):
    from hpcgnn.sampling.kernels import build

    cache = tmp_path / "cache"
    path = build.build(cache)
    lib, said = kernels_with(cache=cache, cc="no-such-cc")
    assert lib is not None and said == [] and lib._name == str(path)
    # ... but not one built for a CPU feature this CPU lacks (a wrapper's -march): it would die of SIGILL
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**meta, "isa": ["sve"]}))
    lib, said = kernels_with(cache=cache, cc="no-such-cc")
    assert lib is None and len(said) == 1 and "no C compiler 'no-such-cc' on PATH" in said[0], said


@needs_cc
def test_4_a_cache_folder_others_may_write_is_refused(kernels_with, tmp_path):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    lib, said = kernels_with(cache=cache)
    assert lib is None and len(said) == 1, said
    assert re.search(rf"the cache folder {cache} is refused: others may write it \(mode 0777, owner uid \d+\).* HINT: "
                     r"chmod go-w it, or set HPCGNN_NATIVE_CACHE to a folder of your own", said[0]), said
    assert list(cache.iterdir()) == []  # nothing built there


def test_4_the_installed_package_carries_the_kernels_of_its_own_source():
    """An editable install (make setup) and a wheel build the kernels at install time (setup.py): the one beside the
    source loads and answers this source's hash."""
    from hpcgnn.sampling.kernels import build

    path = build.packaged()
    if shutil.which("cc") is None:
        pytest.skip("installed without a compiler: no library in the package")
    assert path is not None, "pip install -e . should have built hpcgnn/sampling/kernels/_kernels*.so (setup.py)"
    assert build.load(path).hpcgnn_source_hash().decode() == build.source_hash()


# ------------------------------------------------------------------ 6, 7. one job per run folder; this attempt's report


def _one_line(res: subprocess.CompletedProcess, kind: str) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpcgnn: {kind}: ") and "Traceback" not in res.stdout, res.stderr
    return lines[0]


@pytest.mark.slow
def test_6_a_second_run_in_a_folder_where_one_runs_is_refused_naming_it(tmp_path):
    """Run A trains; run B is started in A's folder: B exits 2 naming A, and A ends as it would have alone (its
    checkpoints its own)."""
    folder = tmp_path / "a"
    folder.mkdir()
    log = folder / "out.txt"
    args = [sys.executable, "-m", "hpcgnn", *TINY, "train.epochs=12", "launch.procs=1", "debug.slow_rank=0",
            "debug.slow_s=0.05",
            "checkpoint.every_steps=5", "checkpoint.keep=2",
            "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", f"hydra.run.dir={folder / 'run'}"]
    a = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=folder)
    deadline = time.monotonic() + 120
    while "epoch 1/12" not in log.read_text() and a.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    b = run_cli(*TINY, "train.epochs=1", "launch.procs=1", cwd=folder, timeout=120)
    assert b.returncode == 2, b.stdout + b.stderr
    line = _one_line(b, "run folder in use")
    assert re.search(rf"the run folder {folder / 'run'} is in use by a local run's launcher \(pid {a.pid} on \S+, since "
                     r"[\d-]+ [\d:]+\)\. HINT: wait for it to end, stop it, or give this run another folder "
                     r"\(hydra.run.dir=\.\.\.\)", line), line
    assert a.wait(timeout=180) == 0, log.read_text()
    summary = summary_of(folder)
    assert summary["resumes"] == 0 and summary["history"][-1]["epoch"] == 12


@pytest.mark.slow
def test_6_a_job_whose_folder_is_held_is_refused_at_submission_and_on_its_ranks(tmp_path):
    """The folder's lock held (by this test, as a running job's rank 0 would): a submission is refused before it is
    made, and ranks started by hand (srun's way: launch.mode=rank) refuse on their own, with exit 2 and one line."""
    from hpcgnn import runlock

    held = runlock.take(tmp_path / "run", "rank 0 of 2", job_id="4242")
    try:
        res = run_cli("+cluster=local", *TINY, cwd=tmp_path)
        assert res.returncode == 2 and not (tmp_path / "run" / "submitit").exists(), res.stdout + res.stderr
        assert "in use by rank 0 of 2 (pid" in _one_line(res, "run folder in use") and ", job 4242, since" in res.stderr
        assert "HINT: wait for it to end, stop it (scancel 4242)" in res.stderr
        res = run_cli("launch.mode=rank", *TINY, cwd=tmp_path)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "in use by rank 0 of 2" in _one_line(res, "run folder in use")
        assert not (tmp_path / "run" / "failures").exists()  # the running job's records are not touched
    finally:
        held.release()
    runlock.check_free(tmp_path / "run")  # its holder gone, the folder is free again


@pytest.mark.slow
def test_7_a_successful_rerun_after_a_failure_reports_its_own_result(tmp_path):
    failed = run_cli("+cluster=local", *TINY, "debug.fail_rank=0", "debug.fail_step=2", cwd=tmp_path)
    assert failed.returncode == 1 and "injected failure" in failed.stderr, failed.stdout + failed.stderr
    again = run_cli("+cluster=local", *TINY, cwd=tmp_path)  # the same command, without the fault
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"^test accuracy \d\.\d{4} ", again.stdout, re.M) and "Traceback" not in again.stderr
    assert "an earlier attempt's failure records were moved to" in again.stdout
    (aside,) = (tmp_path / "run" / "failures" / "previous").iterdir()
    assert (aside / "rank-0.json").is_file() and not list((tmp_path / "run" / "failures").glob("*.json"))


# ------------------------------------------------------------------ 8. no silent or invalid result


def _strict_json(path: Path) -> dict:
    """``path`` read as JSON that every reader takes: NaN or Infinity refused."""
    def refuse(name):
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def _files(tmp_path, **override) -> str:
    from test_datasets import _write_files

    _write_files(tmp_path / "g", n=300, **{"edge_index": np.random.default_rng(2).integers(0, 300, (2, 3000)),
                                           "x": np.random.default_rng(3).normal(size=(300, 4)).astype(np.float32),
                                           "y": np.random.default_rng(4).integers(0, 3, 300),
                                           "train_idx": np.arange(0, 150), "val_idx": np.arange(150, 200),
                                           "test_idx": np.arange(200, 300), **override})
    return f"dataset.path={tmp_path / 'g'}"


SMALL_FILES = ["dataset=files", f"dataset.root={DATA_ROOT}", "train.batch_size=64", "train.epochs=3",
               "model.hidden_channels=16", "metrics.tensorboard=false"]


def test_8_an_empty_validation_split_is_refused_unless_the_last_epoch_is_asked_for(tmp_path):
    from conftest import make_config

    with pytest.raises(ConfigError, match=r"dataset.val_fraction=0 leaves the validation split of dataset synthetic "
                                          r"empty: no epoch can be chosen by a validation metric. HINT: give the "
                                          r"dataset a validation split, or set train.select=last"):
        make_config("dataset.val_fraction=0")
    path = _files(tmp_path, val_idx=np.array([], dtype=np.int64))
    with pytest.raises(DatasetError, match=r"the validation split of dataset files is empty: no epoch can be chosen "
                                           r"by a validation metric. HINT: .* or set train.select=last"):
        train_here(*SMALL_FILES, path, run_dir=tmp_path / "refused")
    summary = train_here(*SMALL_FILES, path, "train.select=last", run_dir=tmp_path / "last")
    last = summary["history"][-1]
    assert summary["best_epoch"] == 3 and summary["test"] == last["test_acc"] and summary["best_val"] is None
    assert "val_acc" not in last and _strict_json(tmp_path / "last" / "summary.json")["select"] == "last"
    from hpcgnn.results import result_words

    assert re.match(r"test accuracy \d\.\d{4} \(last epoch, 3\)$", result_words(summary)), result_words(summary)


def test_8_an_empty_test_split_is_reported_absent_never_nan(tmp_path, caplog):
    from hpcgnn.results import result_words

    path = _files(tmp_path, test_idx=np.array([], dtype=np.int64))
    with caplog.at_level(logging.WARNING, logger="hpcgnn"):
        logging.getLogger("hpcgnn").propagate = True
        summary = train_here(*SMALL_FILES, path, run_dir=tmp_path / "run")
    assert "the test split of dataset files is empty: the summary reports no test metric" in caplog.text
    written = _strict_json(tmp_path / "run" / "summary.json")
    assert written["test"] is None and summary["test"] is None and "test_acc" not in written["history"][-1]
    assert written["best_val"] == max(row["val_acc"] for row in written["history"])
    assert re.match(r"no test accuracy \(the test split is empty\) \(best val \d\.\d{4} at epoch \d\)$",
                    result_words(summary)), result_words(summary)


def test_8_a_single_class_is_refused(tmp_path):
    from conftest import make_config

    with pytest.raises(ConfigError, match=r"dataset.num_classes=1: node classification with a single class predicts it "
                                          r"for every node, and scores accuracy 1.0 whatever the model learned. HINT: "):
        make_config("dataset.num_classes=1")
    make_config("dataset.num_classes=1", "task=link")  # link prediction has no classes to predict
    path = _files(tmp_path, y=np.zeros(300, dtype=np.int64))
    with pytest.raises(DatasetError, match=r"dataset files has 1 class: node classification with a single class"):
        train_here(*SMALL_FILES, path, run_dir=tmp_path / "run")


def test_8_what_hpcgnn_writes_as_json_is_always_json(tmp_path):
    from hpcgnn.io import write_json

    write_json(tmp_path / "s.json", {"loss": float("nan"), "rows": [1.0, float("inf"), (2.0, -float("inf"))]})
    assert _strict_json(tmp_path / "s.json") == {"loss": None, "rows": [1.0, None, [2.0, None]]}


# ------------------------------------------------------------------ 9. resources checked before they are taken


def test_9_batch_slots_are_bounded_by_shared_memory_and_the_nodes_memory():
    from conftest import make_config

    from hpcgnn.checks import check_slots

    cfg = make_config("train.prefetch=2000", "train.sampler_procs=1", "launch.procs=1")
    with pytest.raises(ConfigError, match=r"train.prefetch=2000 with train.sampler_procs=1: 2000 shared-memory slots "
                                          r"of 64 MiB per rank take 250.0 GiB for 2 rank\(s\) on this machine, but "
                                          r"/dev/shm has 22.0 GiB free. HINT: lower train.prefetch"):
        check_slots(cfg, 2, 22 * 2**30, 2**40, "this machine")
    with pytest.raises(ConfigError, match=r"take 125.0 GiB for 1 rank\(s\) on a node of c, more than 50% of its 128.0 "
                                          r"GiB of memory"):
        check_slots(cfg, 1, None, 128 * 2**30, "a node of c")
    check_slots(make_config("train.sampler_procs=1", "launch.procs=1"), 2, 2**30, 8 * 2**30, "this machine")
    served = make_config("train.prefetch=400", "launch.sampler_servers=2")
    with pytest.raises(ConfigError, match=r"train.prefetch=400 with 2 sampler server\(s\): 800 batch slots of 64 MiB "
                                          r"per rank"):
        check_slots(served, 2, None, 64 * 2**30, "this machine")


@pytest.mark.slow
def test_9_a_prefetch_that_cannot_fit_is_refused_before_anything_starts(tmp_path):
    res = run_cli("train.prefetch=20000", "train.sampler_procs=1", "launch.procs=1", cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "starting" not in res.stdout, res.stdout + res.stderr
    assert re.search(r"20000 shared-memory slots of 64 MiB per rank take 1250.0 GiB for 1 rank\(s\) on this machine, "
                     r"but /dev/shm has [\d.]+ GiB free", _one_line(res, "config error"))


def test_9_server_counts_are_checked_against_ranks_and_sampler_processes():
    from conftest import make_config

    with pytest.raises(ConfigError, match=r"3 sampler servers for 1 rank\(s\) on a partitioned graph: .* HINT: at most "
                                          r"1 sampler server"):
        make_config("launch.procs=1", "launch.sampler_servers=3", "graph=partitioned")
    with pytest.raises(ConfigError, match=r"train.sampler_procs=1 with 1 sampler server\(s\): the servers make every "
                                          r"training batch.* HINT: set train.sampler_procs=0"):
        make_config("train.sampler_procs=1", "launch.sampler_servers=1")
    with pytest.raises(ConfigError, match=r"launch.sampler_servers=-1 must be 0 \(none\) or more"):
        make_config("launch.sampler_servers=-1")
    with pytest.raises(ConfigError, match=r"4 sampler servers for 2 rank\(s\) on a partitioned graph"):
        make_config("+cluster=devcluster", "cluster.nodes=1", "cluster.tasks_per_node=2", "cluster.samplers.nodes=2",
                    "cluster.samplers.tasks_per_node=2", "graph=partitioned")
    make_config("launch.procs=2", "launch.sampler_servers=3")  # a whole graph: every trainer reads every server


# ------------------------------------------------------------------ 10. a full disk during a checkpoint


@pytest.mark.slow
def test_10_a_full_disk_during_a_checkpoint_exits_2_and_keeps_the_one_before(tmp_path):
    """Two ranks checkpoint every 2 steps onto a file system with room for one checkpoint and a half: the second
    cannot be written; the run stops with exit 2 and one line (the folder, bytes needed and free), and the first
    checkpoint is whole (a later run there with room resumes from it)."""
    args = [*TINY, "train.epochs=4", "checkpoint.every_steps=2", "checkpoint.keep=5", "metrics.tensorboard=false"]
    roomy = run_cli(*args, cwd=tmp_path / "roomy")
    assert roomy.returncode == 0, roomy.stderr
    first = sorted((tmp_path / "roomy" / "run" / "checkpoints").glob("step-*"))[0]
    pages = sum(-(-f.stat().st_size // 4096) for f in first.iterdir())
    checkpoints = tmp_path / "full" / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(pages * 1.5 + 2) * 4096}", "tmpfs",
                              str(checkpoints)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small file system here to fill: {mounted.stderr.strip()}")
    try:
        full = run_cli(*args, cwd=tmp_path / "full")
        assert full.returncode == 2, full.stdout + full.stderr
        line = _one_line(full, "checkpoint error")
        assert re.search(rf"the checkpoint of step 4 does not fit in {checkpoints}: it needs about [\d.]+ [KMG]iB and "
                         rf"[\d.]+ [KMG]iB are free there \(the disk is full, or your quota\); the checkpoint "
                         rf"{checkpoints / 'step-000000002'} is intact\. HINT: free space there", line), line
        from hpcgnn.io import sha256_file
        from hpcgnn.rank.checkpoint import _manifest

        (kept,) = checkpoints.glob("step-*")
        manifest = _manifest(kept)
        assert manifest["step"] == 2 and all(sha256_file(kept / n) == h for n, h in manifest["files"].items())
        assert not [p for p in checkpoints.iterdir() if p.name.startswith(".")]  # no half-written one left
    finally:
        subprocess.run(["umount", str(checkpoints)], capture_output=True)


# ------------------------------------------------------------------ 11. the preemption signal sent to the launcher


@pytest.mark.slow
def test_11_usr2_to_a_local_launcher_checkpoints_exits_3_and_the_same_command_resumes(tmp_path):
    """USR2 (what `scancel --signal=USR2` or a wrapper sends) to the process the user started: the rank gets it,
    checkpoints and stops, the launcher exits 3; the same command resumes from that checkpoint to the end (that a
    resume after the preemption signal is bitwise: test_train)."""
    args = [*TINY, "train.epochs=6", "launch.procs=1", "debug.slow_rank=0", "debug.slow_s=0.1",
            "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}"]  # (slow steps: the signal comes while it trains)
    folder = tmp_path / "cut"
    folder.mkdir()
    log = folder / "out.txt"
    command = [sys.executable, "-m", "hpcgnn", *args, f"hydra.run.dir={folder / 'run'}"]
    child = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=folder,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while "epoch 1/6" not in log.read_text() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGUSR2)
    assert child.wait(timeout=120) == 3, log.read_text()
    out = log.read_text()
    assert "hpcgnn: SIGUSR2 received: passed to the ranks: they checkpoint at their next step and stop" in out
    assert re.search(r"hpcgnn: preempted: checkpoint of step \d+ saved in .*; run the same command with "
                     rf"hydra.run.dir={folder / 'run'} to resume", out), out
    again = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = summary_of(folder)
    assert resumed["resumes"] == 1 and [r["epoch"] for r in resumed["history"]] == list(range(1, 7))
    assert "resumed from" in again.stdout


# ------------------------------------------------------------------ 12. a new user's first steps on a cluster


def test_12_a_long_prepare_says_how_far_it_is(caplog):
    from hpcgnn.logs import Progress

    with caplog.at_level(logging.INFO, logger="hpcgnn"):
        logging.getLogger("hpcgnn").propagate = True
        p = Progress("reading edges", 2_000_000, "edges", every_s=0.0)
        p.advance(500_000)
        p.advance(1_500_000)
        p.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert re.match(r"reading edges: 500.0k of ~2.0M edges \(25%\) in \d+ s, [\d.]+[kMG]?/s$", lines[0]), lines
    assert re.match(r"reading edges: 2.0M of ~2.0M edges \(100%\)", lines[1]) and "reading edges: 2.0M edges in" in lines[2]


@pytest.mark.slow
def test_12_data_prepare_tells_what_it_does(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hpcgnn", "data", "prepare", "dataset.num_nodes=3000",
                          f"dataset.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^\d\d:\d\d:\d\d \[prepare\] preparing synthetic into ", res.stdout, re.M), res.stdout


def test_12_every_library_hpcgnn_imports_is_declared():
    """A plain `pip install` brings what hpcgnn imports: each third-party module it imports (anywhere in the
    package) comes from a distribution pyproject.toml names."""
    import ast
    import importlib.metadata

    import tomllib
    from conftest import REPO

    declared = {re.split(r"[<>=!~\[ ;]", d)[0].lower().replace("_", "-")
                for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    imported = set()
    for path in (REPO / "hpcgnn").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = sorted(m for m in imported - set(sys.stdlib_module_names) if m not in ("hpcgnn", "_ctypes"))
    dists = importlib.metadata.packages_distributions()
    missing = [m for m in third_party
               if not {d.lower().replace("_", "-") for d in dists.get(m, [m])} & declared]
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_12_hydras_launcher_and_sweeper_plugins_point_to_cluster_and_m():
    from conftest import make_config

    for override in ("hydra/launcher=submitit_slurm", "hydra/sweeper=optuna"):
        with pytest.raises(ConfigError, match=rf"{override}: hpcgnn submits and sweeps by itself, not through Hydra's "
                                              r"launcher and sweeper plugins. HINT: submit with \+cluster=NAME .* and "
                                              r"sweep with -m"):
            make_config(override)


@needs_cc
def test_4_a_cache_folder_that_cannot_be_written_says_so_and_a_library_built_there_still_loads(kernels_with, tmp_path):
    """A read-only cache (a project space mounted read-only on compute nodes): nothing can be built there, and the
    warning names the folder and HPCGNN_NATIVE_CACHE, not a compiler; a library built there before still loads."""
    from hpcgnn.sampling.kernels import build

    cache = tmp_path / "ro"
    cache.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(cache)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a file system here to make read-only: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        lib, said = kernels_with(cache=cache)
        assert lib is None and len(said) == 1, said
        assert f"the cache folder {cache} cannot be written (Read-only file system)" in said[0]
        assert "Set HPCGNN_NATIVE_CACHE to a folder of your own" in said[0] and "C compiler is" not in said[0]
        subprocess.run(["mount", "-o", "remount,rw", str(cache)], check=True)
        path = build.build(cache)
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        lib, said = kernels_with(cache=cache)
        assert lib is not None and lib._name == str(path) and said == []
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True)  # (lazily: this process maps a library there)
