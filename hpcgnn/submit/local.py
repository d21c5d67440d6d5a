"""No cluster: ``launch.procs`` ranks (and ``launch.sampler_servers`` servers) as processes on this machine, started
with the standard library (this process needs no torch: a fork server imports the ranks' modules once, and forks
each rank from there); the first rank to fail ends the run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from hpcgnn import env, nodes, process
from hpcgnn.config import RunConfig
from hpcgnn.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PREEMPTED, ConfigError
from hpcgnn.io import ignoring_ctrl_c, stop_cleanly_on_sigterm
from hpcgnn.rank.server import serve_locally
from hpcgnn.submit.follow import forwarding, print_result, report_failure

# what a local rank or server imports: once, in the fork server the launcher starts them from
RANK_MODULES = ("hpcgnn.rank.job", "hpcgnn.rank.checkpoint", "hpcgnn.rank.server", "hpcgnn.sampling.server")


def free_port(start: int, port_min: int, port_max: int, host: str = "127.0.0.1") -> int:
    """The first port from ``start`` (wrapping inside the range) that can be bound on ``host`` now."""
    span = port_max - port_min + 1
    for i in range(span):
        port = port_min + (start - port_min + i) % span
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise ConfigError(f"no free port in {port_min}..{port_max} on this host. HINT: set dist.port_min and "
                      "dist.port_max to a range with free ports")


def run_this_rank(cfg: RunConfig) -> int:
    """This process is one rank that srun or torchrun started: train here."""
    from hpcgnn.rank.job import run_rank

    environ = env.current()
    summary = run_rank(cfg, environ)
    if env.RankEnv.from_environ(environ, (cfg.dist.port_min, cfg.dist.port_max), cfg.dist.master_port).is_main:
        print_result(summary)
    return 0


def _start_servers(cfg: RunConfig, ctx) -> tuple[list, dict[str, str]]:
    """``launch.sampler_servers`` local server processes on free ports, and the variable that tells the ranks."""
    d, servers, ports = cfg.dist, [], []
    for k in range(cfg.launch.sampler_servers):
        port = free_port(nodes.derive_port(str(time.time_ns() + k), d.port_min, d.port_max), d.port_min, d.port_max)
        if k == 0 and cfg.debug.server_port:
            port = cfg.debug.server_port
        ports.append(port)
        servers.append(ctx.Process(target=serve_locally, args=(k, port, cfg, os.getpid()),
                                   name=f"hpcgnn-sampler-server-{k}"))
    listed = ",".join(f"127.0.0.1:{p}" for p in ports)
    return servers, ({env.VARIABLES["local_servers"]: listed} if servers else {}) | {env.VARIABLES["run_locked"]: "1"}


def _spawn_entry(local_rank: int, cfg: RunConfig, port: int, parent: int, extra: dict | None = None) -> None:
    """One local rank. A failure it recorded (run_rank) is the launcher's to report, once for the run: the rank
    leaves quietly with its exit code (its traceback stays in the record; ``HYDRA_FULL_ERROR=1`` prints it here
    too). An unrecorded one keeps multiprocessing's traceback on stderr."""
    _end_with_parent(parent)  # (first: importing the rank's modules takes torch, seconds a killed launcher waits)
    from hpcgnn.errors import UserError
    from hpcgnn.rank.checkpoint import catch_early
    from hpcgnn.rank.job import run_rank

    catch_early(cfg.checkpoint.signal)  # the launcher passes its preemption signal on, maybe before training starts
    try:
        run_rank(cfg, {**env.local_rank_environ(local_rank, cfg.launch.procs, port), **(extra or {})})
    except Exception as exc:
        if not getattr(exc, "recorded", False) or env.full_error():
            raise
        sys.exit(exc.exit_code if isinstance(exc, UserError) else EXIT_FAILED)
    finally:
        process.end_quickly()


def _end_with_parent(parent: int) -> None:
    """A local run's rank or server: Ctrl-C is ignored (a terminal sends it to the whole process group; the
    launcher acts on it and stops the run). Linux: SIGTERM this process when the one that started it dies,
    even by SIGKILL (no orphan ranks holding the graph and the cores after a killed launcher)."""
    process.ignore_signals(signal.SIGINT)
    process.die_with_parent(signal.SIGTERM, parent)


def spawn_local(cfg: RunConfig, grace_s: float = 3.0) -> int:
    """``launch.procs`` ranks as spawned processes (the standard library's: this process needs no torch).

    The first rank to fail ends the run: the others get ``grace_s`` to notice (their collectives
    break) and record their own failures, then are terminated. Preemption: every rank exits with
    EXIT_PREEMPTED after the checkpoint, and so does this process.
    """
    from multiprocessing.connection import wait

    d = cfg.dist
    port = d.master_port or free_port(nodes.derive_port(str(time.time_ns()), d.port_min, d.port_max), d.port_min,
                                      d.port_max)
    print(f"starting {cfg.launch.procs} local processes; output folder: {cfg.run_dir}", flush=True)
    ctx = process.start_context(*RANK_MODULES)
    servers, extra = _start_servers(cfg, ctx)
    procs = [ctx.Process(target=_spawn_entry, args=(r, cfg, port, os.getpid(), extra), name=f"hpcgnn-rank-{r}")
             for r in range(cfg.launch.procs)]
    first: tuple[int, int] | None = None  # (rank, exit code) of the first rank that failed
    interrupted = False
    # SIGTERM (kill, timeout, a job's end) raises here, so the finally stops the ranks; SIGKILL: _end_with_parent.
    # Ctrl-C too (the ranks ignore it: it reaches the terminal's whole process group, and the launcher decides).
    def forward() -> str:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, getattr(signal, f"SIG{cfg.checkpoint.signal}"))
        return "passed to the ranks: they checkpoint at their next step and stop (exit 3; the same command resumes)"

    with stop_cleanly_on_sigterm("the run", "stopping its ranks"), forwarding(cfg.checkpoint.signal, forward):
        try:
            for p in [*servers, *procs]:
                p.start()
            running = {p.sentinel: (r, p) for r, p in enumerate(procs)}
            running.update({p.sentinel: (f"sampler server {k}", p) for k, p in enumerate(servers)})
            deadline = None
            while running:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready = wait(list(running), timeout)
                if not ready:  # the grace after the first failure is over
                    break
                for sentinel in ready:
                    rank, p = running.pop(sentinel)
                    p.join()
                    if p.exitcode != 0 and first is None:
                        first, deadline = (rank, p.exitcode), time.monotonic() + grace_s
        except KeyboardInterrupt:
            interrupted = True
            print(f"\nhpcgnn: the run stopped by Ctrl-C; stopping its ranks (output folder: {cfg.run_dir})",
                  file=sys.stderr, flush=True)
        finally:
            # a second Ctrl-C does not cut this short (it is bounded: 10 s a process, then SIGKILL)
            with ignoring_ctrl_c():
                for p in [*procs, *servers]:
                    if p.is_alive():
                        p.terminate()
                for p in [*procs, *servers]:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                        p.join()
    if interrupted:
        return EXIT_INTERRUPTED
    if first is not None:
        rank, code = first
        if code == EXIT_PREEMPTED:  # rank 0 printed where the checkpoint is
            return EXIT_PREEMPTED
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        who = rank if isinstance(rank, str) else f"local rank {rank}"
        return report_failure(Path(cfg.run_dir), f"{who} {how}")
    with open(Path(cfg.run_dir) / "summary.json") as f:
        print_result(json.load(f))
    return 0

