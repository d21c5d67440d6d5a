"""What a local run listens on: loopback only; a server where its trainers reach it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import DATA_ROOT, TINY


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
def test_a_local_run_listens_on_loopback_only(tmp_path):
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


def test_a_server_listens_where_its_trainers_reach_it():
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
