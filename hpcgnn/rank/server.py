"""A sampler server's process, however it was started: the one entry of both kinds.

- :func:`main` (``python -m hpcgnn.rank.server CONFIG``): a task of the job's server group (a heterogeneous
  SLURM job's group 1) or of a separate servers' job (``cluster.samplers.het=false``, announcing itself in the run
  folder); where it listens follows from the job's variables (:func:`hpcgnn.env.this_server`);
- :func:`serve_locally`: one of ``launch.sampler_servers`` processes the local launcher spawned, on loopback,
  dying with the launcher.

Both: one log line format, the trainers' signals left to them, the server (:func:`hpcgnn.sampling.server.run_server`)
run until its trainers are done; a user error (a taken port, a refused secret) is recorded by the server for the
trainers and the launcher and leaves with its exit code; anything else keeps its traceback.
"""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

from hpcgnn import env, nodes, paths, process, trust
from hpcgnn.config import RunConfig
from hpcgnn.errors import UserError, describe
from hpcgnn.logs import setup_logging


def _serve(cfg: RunConfig, index: int, port: int, trainers: int, threads: int, host: str, main: bool,
           announce: Path | None = None, idle_s: float = 1800.0) -> None:
    from hpcgnn.data import prepare
    from hpcgnn.sampling.server import run_server
    from hpcgnn.stores import ServerRecipes
    from hpcgnn.tasks import task_items

    setup_logging(f"server {index}", main=main)
    dbg = cfg.debug
    recipes = ServerRecipes(cfg, task_items(cfg))
    run_server(index, port, trainers, threads, cfg.run_dir, trust.run_secret(cfg.run_dir), recipes,
               prepare=lambda: prepare(cfg.dataset), host=host, idle_s=idle_s, announce=announce,
               fail_batch=dbg.sampler_fail_batch if dbg.sampler_fail_rank == index else -1)


def main(argv: list[str] | None = None) -> int:
    """A server of a SLURM job. A user error is printed as one line. Exit code: the error's."""
    from hpcgnn.sampling.server import bind_address, trainers_of

    argv = sys.argv[1:] if argv is None else argv
    trust.private_umask()
    try:
        trust.run_folder(Path(argv[0]).parent.parent)  # (the config below is in the run's submitit/)
        cfg = RunConfig.from_json(paths.read_own(argv[0], "the servers' config"))
    except UserError as exc:
        print(describe(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    process.ignore_signals(signal.SIGUSR1, signal.SIGUSR2)  # the trainers' preemption signal: theirs to act on
    environ = env.current()
    index, port = env.this_server(environ, (cfg.dist.port_min, cfg.dist.port_max))
    sn = cfg.cluster.samplers
    trainers = trainers_of(index, sn.nodes * sn.tasks_per_node, cfg.world_size, cfg.graph.mode == "partitioned")
    own = env.read("node_name", environ) or socket.gethostname()
    peers = nodes.expand_nodelist(env.read("trainer_nodelist", environ) or "") if sn.het else []
    try:
        _serve(cfg, index, port, trainers, env.slurm_cpus_per_task(environ) or 1, bind_address(own, peers), True,
               announce=None if sn.het else trust.announced(cfg.run_dir) / str(index), idle_s=cfg.dist.init_timeout_s)
    except UserError as exc:  # (recorded by run_server)
        if env.full_error():
            raise
        print(describe(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


def serve_locally(index: int, port: int, cfg: RunConfig, parent: int) -> None:
    """One local sampler server: serves every rank on loopback, then leaves. A user error leaves quietly with its
    code (the launcher reports its line, as a rank's)."""
    from hpcgnn.sampling.server import trainers_of

    process.ignore_signals(signal.SIGINT)  # a terminal's Ctrl-C is the launcher's to act on
    process.die_with_parent(signal.SIGTERM, parent)
    trainers = trainers_of(index, cfg.launch.sampler_servers, cfg.launch.procs, cfg.graph.mode == "partitioned")
    try:
        _serve(cfg, index, port, trainers, cfg.train.sampler_threads or 1, "127.0.0.1", index == 0)
    except UserError as exc:
        if env.full_error():
            raise
        process.exit_now(exc.exit_code)
    process.exit_now(0)  # (its trainers have gone: nothing is left to finalise)


if __name__ == "__main__":
    process.exit_now(main())  # (a SLURM task's server, done: nothing is left to finalise)
