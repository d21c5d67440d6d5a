"""A connection storm against a run's sampler server: does the run finish, bitwise, and how much slower?

    python benchmarks/storm.py [--connections 600] [--repeats 3] [--num-nodes 20000] [--epochs 3] [--root DIR]

Another user of the machine holds ``--connections`` connections open to the run's sampler server at once, from
the moment it starts listening to the run's end: each one the server drops (for room, or at its handshake's
deadline) is opened again at once, and every half second a tenth of them is closed and reopened. The run (one
rank, one sampler server on loopback, ``launch.sampler_servers=1``) runs quiet and under the storm, in turn,
``--repeats`` times each. Prints one comparison line: the exit codes, whether the parameters are bitwise those of
the quiet run, the median wall times and their ratio (issue 73's bar: within 1.5x), and the storm's connections.
The storm sends traffic to 127.0.0.1 alone, and stops by itself when the run ends (or after 10 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def storm(port: int, connections: int, stop, opened) -> None:
    """Hold ``connections`` open to 127.0.0.1:``port``; reopen each one dropped; churn a tenth every 0.5 s."""
    rnd, sel, held = random.Random(0), selectors.DefaultSelector(), set()
    end, churn_at = time.monotonic() + 600, time.monotonic() + 0.5

    def open_one() -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        held.add(s)
        opened.value += 1

    def close(s) -> None:
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(s)
        held.discard(s)
        s.close()

    while not stop.is_set() and time.monotonic() < end:
        while len(held) < connections and not stop.is_set():
            open_one()
            if not held:
                time.sleep(0.05)
                break
        for key, _ in sel.select(timeout=0.05):
            try:
                gone = key.fileobj.recv(4096) in (b"",) or False
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:  # (the greeting arrives first; the server's BUSY and close after it)
                close(key.fileobj)
        if time.monotonic() > churn_at:
            for s in rnd.sample(sorted(held, key=id), len(held) // 10):
                close(s)
            churn_at = time.monotonic() + 0.5
    for s in list(held):
        close(s)


def one_run(args, folder: Path, port: int, under_storm: bool) -> dict:
    run_dir = folder / f"run-{'storm' if under_storm else 'quiet'}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "hpcgnn", f"dataset.num_nodes={args.num_nodes}", f"train.epochs={args.epochs}",
           "train.batch_size=256", "model.hidden_channels=64", "launch.procs=1", "metrics.tensorboard=false",
           f"dataset.root={args.root}", "launch.sampler_servers=1", f"debug.server_port={port}",
           f"hydra.run.dir={run_dir}"]
    ctx = mp.get_context("spawn")
    stop, opened = ctx.Event(), ctx.Value("i", 0)
    attacker = ctx.Process(target=storm, args=(port, args.connections, stop, opened))
    if under_storm:
        attacker.start()
        deadline = time.monotonic() + 10
        while opened.value == 0 and time.monotonic() < deadline:  # (the attacker dials before the server listens)
            time.sleep(0.05)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if under_storm:
        stop.set()
        attacker.join(30)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    if res.returncode != 0:
        print(res.stderr[-2000:], file=sys.stderr)
    return {"code": res.returncode, "wall": wall, "params": summary.get("param_checksums"), "opened": opened.value}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-nodes", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--root", default=os.path.expanduser("~/.cache/hpcgnn"))
    args = ap.parse_args()
    port = 43000 + os.getpid() % 2000
    with tempfile.TemporaryDirectory(prefix="hpcgnn-storm-") as tmp:
        quiet, stormy = [], []
        one_run(args, Path(tmp), port, False)  # (prepares the graph: not timed)
        for _ in range(args.repeats):
            quiet.append(one_run(args, Path(tmp), port, False))
            stormy.append(one_run(args, Path(tmp), port, True))
    q, s = statistics.median(r["wall"] for r in quiet), statistics.median(r["wall"] for r in stormy)
    bitwise = all(r["params"] is not None and r["params"] == quiet[0]["params"] for r in quiet + stormy)
    print(f"storm: {args.connections} connections held open (reopened when dropped, a tenth churned every 0.5 s; "
          f"{min(r['opened'] for r in stormy)}-{max(r['opened'] for r in stormy)} opened per run): exit codes quiet "
          f"{[r['code'] for r in quiet]} storm {[r['code'] for r in stormy]}; parameters bitwise equal: {bitwise}; "
          f"wall median of {args.repeats} quiet {q:.1f} s, storm {s:.1f} s: {s / q:.2f}x (bar 1.5x)")


if __name__ == "__main__":
    main()
