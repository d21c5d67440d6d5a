"""Sampler servers in the same SLURM job: the heterogeneous script submitit cannot render, and its fallback.

A run whose cluster file has ``samplers: {nodes: N, ...}`` is one heterogeneous job (``#SBATCH hetjob``):
group 0 holds the trainers, started exactly as submitit starts any job (its pickled entry point, its USR2
requeue handler, its result files); group 1 holds the sampler servers, started in the background before
them (``srun --het-group=1 python -m hpcgnn.rank.server``) and stopped after them. The two sides find
each other from SLURM's variables alone (``SLURM_JOB_NODELIST_HET_GROUP_1`` and the leader's job id, read in
:mod:`hpcgnn.env`), never from addresses in a config.

Where a site refuses heterogeneous jobs (``samplers.het: false``), the servers run as a second job
submitted first; the trainers' job is held until it has started (``--dependency=after:<servers>``), and
each server writes where it listens into the run folder (``servers/<k>``), where the trainers read it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpcgnn.config import ClusterConfig, RunConfig

SERVERS_CONFIG = "sampler-servers.json"  # the run's config, for the servers (in submitit's folder)


def server_directives(c: ClusterConfig) -> list[str]:
    """The ``#SBATCH`` lines of the servers' group."""
    s = c.samplers
    lines = [f"--job-name={c.job_name}-samplers", f"--nodes={s.nodes}", f"--ntasks-per-node={s.tasks_per_node}",
             f"--cpus-per-task={s.cpus_per_task or c.cpus_per_task}", f"--time={c.time_min}"]
    for key, value in (("partition", s.partition or c.partition), ("account", c.account), ("qos", c.qos)):
        if value is not None:
            lines.append(f"--{key}={value}")
    if s.mem_gb is not None:
        lines.append(f"--mem={int(s.mem_gb)}G" if float(s.mem_gb).is_integer() else f"--mem={int(s.mem_gb * 1024)}M")
    return [f"#SBATCH {line}" for line in lines]


def server_command(python: str, folder: Path, het: bool) -> str:
    """The srun line that starts the servers (output per server in submitit's folder)."""
    group = "--het-group=1 " if het else ""
    out = shlex.quote(str(folder / "%j_server_%t.out"))
    return (f"srun {group}--unbuffered --output {out} --error {out} "
            f"{shlex.quote(python)} -u -m hpcgnn.rank.server {shlex.quote(str(folder / SERVERS_CONFIG))}")


def heterogeneous(text: str, cfg: RunConfig) -> str:
    """submitit's sbatch script made heterogeneous: its directives are group 0, the servers' group 1; the
    servers start in the background before the trainers' srun (now ``--het-group=0``) and stop after it."""
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    run = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    python = shlex.split(lines[run])[-5] if "submitit.core._submit" in lines[run] else "python"
    folder = Path(shlex.split(lines[run])[-1])
    trainers = lines[run].replace("srun ", "srun --het-group=0 ", 1)
    out = lines[: last + 1] + ["#SBATCH hetjob", *server_directives(cfg.cluster)] + lines[last + 1: run]
    out += ["# sampler servers (het group 1), then the trainers (het group 0)",
            f"{server_command(python, folder, het=True)} &", "HPCGNN_SERVERS=$!", trainers, "status=$?",
            'kill "$HPCGNN_SERVERS" 2>/dev/null', "wait", 'exit "$status"'] + lines[run + 1:]
    return "\n".join(out) + "\n"


def write_servers_config(cfg: RunConfig, folder: Path) -> Path:
    """The run's config where the servers read it (``python -m hpcgnn.rank.server PATH``): its fields as JSON,
    nothing pickled (:meth:`RunConfig.from_json`)."""
    from hpcgnn.trust import write_own_file

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SERVERS_CONFIG
    write_own_file(path, cfg.to_json())  # (0600: read back only when the run folder is the user's own)
    return path


def servers_script(cfg: RunConfig, folder: Path, python: str) -> str:
    """The servers' own job (``samplers.het: false``): its directives, the cluster's setup lines, one srun."""
    c = cfg.cluster
    out = shlex.quote(str(folder / "%j_server_%t.out"))
    lines = ["#!/bin/bash", "", "# Parameters", *server_directives(c), f"#SBATCH --output={folder / '%j_servers.out'}",
             "", "# setup", *c.setup, "", "# sampler servers: the trainers' job starts once this one has",
             f"srun --unbuffered --output {out} --error {out} {shlex.quote(python)} -u -m hpcgnn.rank.server "
             f"{shlex.quote(str(folder / SERVERS_CONFIG))}"]
    return "\n".join(lines) + "\n"


def submit_servers(cfg: RunConfig, folder: Path, python: str) -> str:
    """Submit the servers' job; its id."""
    import subprocess

    script = folder / "sampler-servers.sbatch"
    folder.mkdir(parents=True, exist_ok=True)
    script.write_text(servers_script(cfg, folder, python))
    res = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"sbatch refused the sampler servers' job: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]
