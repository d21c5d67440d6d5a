"""Submitting to a cluster: SLURM parameters from the cluster file, submitit's executor (local or SLURM), the sbatch
script it renders (dry runs print that same script), and what is checked against the cluster before submitting.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from hpcgnn import env
from hpcgnn.config import ClusterConfig, RunConfig
from hpcgnn.errors import ConfigError
from hpcgnn.io import ignoring_ctrl_c
from hpcgnn.submit.compose import resolved_yaml


def slurm_parameters(c: ClusterConfig) -> dict:
    """submitit SlurmExecutor parameters for a cluster file (values are quoted by submitit)."""
    params: dict = {
        "job_name": c.job_name,
        "nodes": c.nodes,
        "ntasks_per_node": c.tasks_per_node,
        "cpus_per_task": c.cpus_per_task,
        "time": c.time_min,
        "signal_delay_s": c.signal_delay_s,
        "setup": list(c.setup),
        "additional_parameters": dict(c.sbatch_extra),
        # One failed rank ends the step: the others would only wait for it until a timeout.
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    if c.gpus_per_node:
        params["gpus_per_node"] = c.gpus_per_node
    if c.mem_gb is not None:
        params["mem"] = f"{int(c.mem_gb)}G" if float(c.mem_gb).is_integer() else f"{int(c.mem_gb * 1024)}M"
    for key in ("partition", "account", "qos", "constraint", "exclude"):
        if getattr(c, key) is not None:
            params[key] = getattr(c, key)
    return params


def job_folder(cfg: RunConfig) -> Path:
    """submitit's folder for the job's pickles and per-task logs."""
    return Path(cfg.run_dir) / "submitit"


@contextlib.contextmanager
def submitting() -> Iterator[None]:
    """Around a submission: what it starts inherits this process's environment without the variables of the
    job it runs in (:func:`hpcgnn.env.outside_job`), and Ctrl-C ignored (:func:`hpcgnn.io.ignoring_ctrl_c`)."""
    with env.outside_job(), ignoring_ctrl_c():
        yield


def make_executor(cfg: RunConfig, python: str | None = None, render_only: bool = False):
    """The submitit executor for ``cfg.cluster``; ``render_only`` builds a SLURM one without srun."""
    import submitit  # lazy: plain local runs and --help stay fast
    from submitit.slurm.slurm import SlurmExecutor

    c = cfg.cluster
    if c is None:
        raise ValueError("make_executor needs a cluster: add +cluster=NAME")
    if c.executor == "local":
        ex = submitit.LocalExecutor(job_folder(cfg), python=python, max_num_timeout=cfg.checkpoint.max_timeouts)
        ex.update_parameters(tasks_per_node=c.tasks_per_node, nodes=1, timeout_min=c.time_min,
                             gpus_per_node=c.gpus_per_node, signal_delay_s=c.signal_delay_s, setup=list(c.setup))
        return ex

    class _RenderOnly(SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:  # SlurmExecutor refuses to exist where srun is missing
            return 1

    base = _RenderOnly if render_only else SlurmExecutor
    if c.samplers.nodes and c.samplers.het:  # trainers and sampler servers: one heterogeneous job
        from hpcgnn.submit.het import heterogeneous

        class _Heterogeneous(base):
            def _make_submission_file_text(self, command: str, uid: str) -> str:
                return heterogeneous(super()._make_submission_file_text(command, uid), cfg)

        base = _Heterogeneous
    ex = base(job_folder(cfg), python=python, max_num_timeout=cfg.checkpoint.max_timeouts)
    ex.update_parameters(**slurm_parameters(c))
    return ex


def render_sbatch(cfg: RunConfig, python: str | None = None) -> str:
    """The sbatch script a submission of ``cfg`` writes, without submitting anything."""
    ex = make_executor(cfg, python=python, render_only=True)
    return ex._make_submission_file_text(ex._submitit_command_str, "dry-run")




def check_partition_capacity(c: ClusterConfig, sinfo: str | None = None) -> None:
    """Before submitting: can the SLURM partition hold the job at all? (Skipped where sinfo cannot tell.)

    ``sinfo`` is the text of ``sinfo -h -o SINFO_FORMAT`` for testing; by default the cluster is asked.
    """
    from hpcgnn.slurm import partitions, pick_partition

    if c.executor != "slurm":
        return
    parts = partitions(sinfo)
    part = pick_partition(parts, c.partition) if parts else None
    if part is None:  # sinfo cannot tell (or lists no such partition: sbatch will say so itself)
        return
    groups = [(g.nodes, g.mem_mb, g.cpus) for g in part.groups]
    where = f"partition {part.name}"
    total = sum(n for n, _, _ in groups)
    if c.nodes > total:
        raise ConfigError(f"cluster.nodes={c.nodes} but {where} has {total} nodes. HINT: set cluster.nodes={total} "
                          "or less, or choose another cluster.partition")
    fit = [g for g in groups if g[2] >= c.tasks_per_node * c.cpus_per_task]
    if not fit:
        most = max(g[2] for g in groups)
        raise ConfigError(f"cluster.tasks_per_node={c.tasks_per_node} x cluster.cpus_per_task={c.cpus_per_task} "
                          f"CPUs, but the nodes of {where} have at most {most}. HINT: lower one of them")
    biggest = max(g[1] for g in groups)
    if c.mem_gb is not None and biggest > 1 and c.mem_gb * 1024 > biggest:  # 1 MB: RealMemory not configured
        raise ConfigError(f"cluster.mem_gb={c.mem_gb} but the nodes of {where} have at most "
                          f"{biggest / 1024:.1f} GB. HINT: set cluster.mem_gb={int(biggest // 1024)} or less")
    if sum(n for n, _, cpus in fit) < c.nodes:
        raise ConfigError(f"cluster.nodes={c.nodes} nodes with {c.tasks_per_node * c.cpus_per_task} CPUs each, but "
                          f"{where} has only {sum(n for n, _, _ in fit)} such nodes")


def dry_run_text(cfg: RunConfig) -> str:
    if cfg.cluster is None:
        plan = f"# would start {cfg.launch.procs} local processes (no +cluster given)"
    elif cfg.cluster.executor == "local":
        plan = f"# would start {cfg.cluster.tasks_per_node} tasks with submitit's LocalExecutor in {job_folder(cfg)}"
    else:
        plan = "# sbatch script\n" + render_sbatch(cfg)
        if cfg.cluster.samplers.nodes and not cfg.cluster.samplers.het:
            from hpcgnn.submit.het import servers_script

            plan = ("# sampler servers' sbatch script (submitted first; the trainers' job waits for it to start)\n"
                    + servers_script(cfg, job_folder(cfg), sys.executable) + "\n" + plan)
    return f"{plan}\n\n# resolved config\n{resolved_yaml(cfg)}"

