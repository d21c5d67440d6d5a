"""From a RunConfig to running ranks: local processes, submitit's local executor, or sbatch.

How (``launch.mode``, default ``auto``: see :func:`launch_mode`):

- ``rank``: srun or torchrun started this process as one rank: it trains in place;
- ``local``: ``launch.procs`` processes on this machine (torch.multiprocessing, spawn);
- ``submit``: to the cluster of ``+cluster=NAME``: submitit's LocalExecutor
  (``cluster.executor=local``, tasks on this machine with job folders) or its SlurmExecutor,
  which writes and submits the sbatch script.

The sbatch script is rendered by submitit's own code path for dry runs too, so
``launch.dry_run=true`` prints exactly the script that a real submission writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from omegaconf import OmegaConf

from hpcgnn import checks, env, process, runlock
from hpcgnn.config import ClusterConfig, RunConfig
from hpcgnn.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USER_ERROR, ConfigError
from hpcgnn.failures import read_failures, set_aside_failures
from hpcgnn.io import atomic_open, ignoring_ctrl_c, stop_cleanly_on_sigterm
from hpcgnn.results import result_words
from hpcgnn.trust import run_secret


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


def resolved_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(dataclasses.asdict(cfg)))


def launch(cfg: RunConfig, overrides: tuple[str, ...] | list[str] = ()) -> int:
    """Run or submit ``cfg``; returns the process exit code (see :mod:`hpcgnn.errors`)."""
    if cfg.launch.dry_run:
        print(dry_run_text(cfg))
        return 0
    mode, why = launch_mode(cfg)
    if why:
        print(f"hpcgnn: {why}", flush=True)
    if mode == "rank":
        return _run_this_rank(cfg)
    if mode == "local":
        cfg = dataclasses.replace(cfg, cluster=None)  # the ranks are these processes, whatever the cluster file says
    with new_attempt(cfg, mode):
        return _start(cfg, mode, overrides)


@contextlib.contextmanager
def new_attempt(cfg: RunConfig, mode: str) -> Iterator[None]:
    """Around starting a run in its folder: one job at a time there (:mod:`hpcgnn.runlock`: a local run's launcher
    holds the folder's lock until the run ends; before a submission, no running job may hold it), and an earlier
    attempt's failure records set aside, so that this attempt's report is its own."""
    lock = runlock.take(cfg.run_dir, "a local run's launcher") if mode == "local" else None
    try:
        if lock is None:
            runlock.check_free(cfg.run_dir)
        aside = set_aside_failures(Path(cfg.run_dir))
        if aside is not None:
            print(f"hpcgnn: an earlier attempt's failure records were moved to {aside}", flush=True)
        yield
    finally:
        if lock is not None:
            lock.release()


def _start(cfg: RunConfig, mode: str, overrides) -> int:
    record_config(cfg, overrides)
    run_secret(cfg.run_dir)  # made here, by the user who starts the run (hpcgnn.trust); refused if others can read it
    check_data_on_disk(cfg.dataset)
    check_model(cfg)
    from hpcgnn.checks import check_thread_budget

    check_thread_budget(cfg, len(os.sched_getaffinity(0)))
    if mode == "submit":
        check_partition_capacity(cfg.cluster)
        c = cfg.cluster
        checks.check_slots(cfg, c.tasks_per_node, None, None if c.mem_gb is None else int(c.mem_gb * 2**30),
                           f"a node of {c.name} (cluster.mem_gb={c.mem_gb})")
    else:
        checks.check_slots(cfg, cfg.launch.procs, checks.shm_free(), env.available_memory(), "this machine")
    after = None
    if cfg.graph.mode == "partitioned":
        after = _ensure_partitioned(cfg, mode)
    if mode == "local":
        return _spawn_local(cfg)
    ex = make_executor(cfg)
    if after is not None:  # SLURM starts training only once partitioning succeeded, and drops it otherwise
        ex.update_parameters(additional_parameters={**cfg.cluster.sbatch_extra, "dependency": f"afterok:{after.job_id}",
                                                    "kill_on_invalid_dep": "yes"})
    from hpcgnn.submit.entry import run_task

    servers = None
    if cfg.cluster.samplers.nodes:  # what the sampler servers start from
        from hpcgnn.submit.het import submit_servers, write_servers_config

        write_servers_config(cfg, job_folder(cfg))
        if not cfg.cluster.samplers.het:  # a job of their own, started first; the trainers' waits for it
            with submitting():
                servers = submit_servers(cfg, job_folder(cfg), sys.executable)
            extra = dict(ex.parameters.get("additional_parameters", {}))
            extra["dependency"] = ",".join(filter(None, [extra.get("dependency"), f"after:{servers}"]))
            ex.update_parameters(additional_parameters=extra)
            print(f"submitted the sampler servers' job {servers}", flush=True)
    with submitting():
        job = ex.submit(run_task, cfg)
    print(f"submitted job {job.job_id} to {cfg.cluster.name} ({cfg.world_size} tasks)"
          f"{f', after partitioning job {after.job_id}' if after is not None else ''}; output folder: {cfg.run_dir}",
          flush=True)
    if cfg.launch.wait is False:
        return 0
    try:
        return _wait(job, cfg, after)
    finally:
        if servers is not None:  # done with the trainers: the servers' job ends too
            subprocess.run(["scancel", servers], capture_output=True)


def check_data_on_disk(dataset) -> None:
    """Before submitting: the files and OGB sources a job reads must be there (synthetic graphs are made where
    they are prepared). The data module's check imports torch: only datasets read from disk pay for it."""
    if dataset.name in (*checks.ON_DISK, *checks.PYG_DATASETS):  # (pyg: its class or function must import)
        from hpcgnn.data import check_available

        check_available(dataset)


def check_model(cfg: RunConfig) -> None:
    """Before submitting: a model of the user's own imports, takes its arguments and returns one row per node on a
    tiny graph (on the CPU, here; torch is imported for it alone); on a typed graph, one of its node types and
    relations (where they are known before the graph is prepared; else the rank checks it as it builds the model)."""
    if checks.is_custom(cfg.model):
        from hpcgnn.models.custom import check_custom

        d = cfg.dataset
        if checks.is_typed(d):
            from hpcgnn.data import typed_shape

            shape = typed_shape(d)
            if shape is not None:
                check_custom(cfg, shape[1], shape[2], schema=shape[0])
            return
        check_custom(cfg, d.num_features if d.name == "synthetic" else 16, d.num_classes if d.name == "synthetic" else 3)


def record_config(cfg: RunConfig, overrides: tuple[str, ...] | list[str]) -> None:
    """``<run_dir>/.hydra/``: the resolved config and the overrides it came from (as Hydra's own runs keep)."""
    folder = Path(cfg.run_dir) / ".hydra"
    with atomic_open(folder / "config.yaml") as f:
        f.write(resolved_yaml(cfg))
    with atomic_open(folder / "overrides.yaml") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))


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


def _ensure_partitioned(cfg: RunConfig, mode: str):
    """Parts for a partitioned run: made here before local ranks start, or by a SLURM job the
    training job depends on (``afterok``), so no training node idles while one node partitions.
    Returns that job, or None when nothing was submitted."""
    from hpcgnn.partition import parts_ready, run_partition

    num_parts = cfg.graph.parts_for(cfg.world_size)
    if parts_ready(cfg.dataset, cfg.graph, num_parts):
        return None
    if mode == "local" or cfg.cluster.executor == "local":
        run_partition(cfg.dataset, cfg.graph, num_parts)
        return None
    _check_partition_job_memory(cfg)
    return submit_partition(cfg)


def _check_partition_job_memory(cfg: RunConfig) -> None:
    """Before submitting: when the graph is prepared and the job's memory is known, will METIS fit?"""
    from hpcgnn.data import cache, cache_folder
    from hpcgnn.partition import check_partition_memory

    folder = cache_folder(cfg.dataset)
    limit = cfg.graph.partition_mem_gb or cfg.cluster.mem_gb
    if limit is None or not cache.is_complete(folder):
        return
    meta = json.loads((folder / "meta.json").read_text())
    check_partition_memory(cfg.graph.method, meta["num_nodes"], meta["num_edges"], int(limit * 2**30))


def partition_job_config(cfg: RunConfig) -> RunConfig:
    """The cluster settings of the partitioning job: no GPU, the job's memory; one task on one node, or
    for ``graph.method=lp`` one task on each of ``cluster.nodes`` nodes (they share the work)."""
    c = cfg.cluster
    nodes = c.nodes if cfg.graph.method == "lp" else 1
    one = dataclasses.replace(c, nodes=nodes, tasks_per_node=1, gpus_per_node=0, job_name=f"{c.job_name}-partition")
    return dataclasses.replace(cfg, cluster=one, run_dir=str(Path(cfg.run_dir) / "partition"))


def submit_partition(cfg: RunConfig):
    from hpcgnn.partition import run_partition_task

    pcfg = partition_job_config(cfg)
    with submitting():
        job = make_executor(pcfg).submit(run_partition_task, cfg)
    print(f"submitted partitioning job {job.job_id} to {cfg.cluster.name}; output folder: {pcfg.run_dir}", flush=True)
    return job


def wait_partition(job, cfg: RunConfig) -> int:
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        job.results()  # every task's (lp shares the work among several)
    except KeyboardInterrupt:
        print(f"\nstopped waiting; partitioning job {job.job_id} goes on", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (FailedJobError, UncompletedJobError) as exc:
        print(f"partitioning job {job.job_id} failed (state {job.state}):\n{exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    for i in range(job.num_tasks):  # task 0 prints the report; every task its peak memory
        text = job.task(i).stdout() if job.num_tasks > 1 else job.stdout()
        sys.stdout.write(text if i == 0 else "".join(line + "\n" for line in (text or "").splitlines()
                                                         if line.startswith("task ")))
    return 0


def launch_mode(cfg: RunConfig, environ=None) -> tuple[str, str]:
    """How this process runs ``cfg``, and why when the guess is not the obvious one.

    ``launch.mode`` other than ``auto`` decides. Otherwise:

    - ``rank``: torchrun, or srun with several tasks in the step, started this process as one
      rank: it trains in place. So does a one-task srun step that is not a shell a user types
      in (a batch script's ``srun python -m hpcgnn``). A batch script with several tasks but
      no srun lands here too, and fails with the srun line to use.
    - ``submit``: with ``+cluster=NAME``, hand the job to the cluster's executor, also from a
      shell inside an allocation (``srun --pty bash``, ``salloc``) or from a batch job.
    - ``local``: start ``launch.procs`` processes on this machine.
    """
    if cfg.launch.mode != "auto":
        return cfg.launch.mode, ""
    if env.started_as_rank(environ):
        return "rank", ""
    interactive = env.interactive_reason(environ)
    tasks = env.srun_step_tasks(environ)
    if tasks is not None:  # a one-task interactive step, or started_as_rank would have said so
        where = f"a one-task interactive SLURM step ({interactive})"
        what = f"submitting to {cfg.cluster.name}" if cfg.cluster is not None else \
            f"starting {cfg.launch.procs} local processes"
        return ("submit" if cfg.cluster is not None else "local",
                f"{where}: {what}; launch.mode=rank trains in this process instead")
    if cfg.cluster is not None:
        return "submit", ""
    job_tasks = env.read_int("job_tasks", environ) or 1
    if env.detect_source(environ) == "slurm" and job_tasks > 1 \
            and interactive is None:
        return "rank", ""  # a batch step that forgot srun: RankEnv says so, with the line to use
    return "local", ""


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


@contextlib.contextmanager
def forwarding(signame: str, forward) -> Iterator[None]:
    """While a launcher waits on its ranks or job: the preemption signal (``checkpoint.signal``, USR2), sent to the
    launcher as a wrapper or ``kill`` would, is handed on by ``forward()`` (which says where it went) instead of
    killing the launcher. Outside the main thread nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signum = getattr(signal, f"SIG{signame}")

    def handle(sig, frame) -> None:
        print(f"hpcgnn: SIG{signame} received: {forward()}", file=sys.stderr, flush=True)

    previous = signal.signal(signum, handle)
    try:
        yield
    finally:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def _print_result(summary: dict) -> None:
    ranks = f"{summary['world_size']} rank{'s' if summary['world_size'] != 1 else ''} on {', '.join(summary['hostnames'])}"
    if summary.get("kind") == "predict":  # hpcgnn predict RUN_DIR
        print(f"{result_words(summary)}, {ranks}, {summary['wall_time_s']:.1f} s", flush=True)
        print(f"outputs: {summary['run_dir']} (manifest.json)", flush=True)
        return
    print(f"{result_words(summary)}, {ranks}, {summary['seeds_per_s']:.0f} seeds/s, {summary['wall_time_s']:.1f} s",
          flush=True)
    if summary.get("nonfinite_skipped"):
        print(f"hpcgnn: WARNING: {summary['nonfinite_skipped']} optimizer step(s) were skipped for NaN/inf gradients "
              "(train.nonfinite=skip)", flush=True)
    print(f"summary: {Path(summary['run_dir']) / 'summary.json'}", flush=True)


def _wait(job, cfg: RunConfig, after=None) -> int:
    """Follow rank 0's log until the job ends, then print its result, its error or its cancellation.

    Result files are checked every ``launch.poll_s``; the scheduler is asked every
    ``launch.state_poll_s``, so a job that ends without results (cancelled, killed,
    node failure) is noticed promptly, not only by submitit's slowing poll. The preemption signal sent to this
    process goes to a SLURM job's ranks (:func:`forwarding`).
    """
    from submitit.slurm.slurm import SlurmJob

    on_slurm = isinstance(job, SlurmJob)

    def forward() -> str:
        if not on_slurm:
            return ("not passed on: submitit's local executor forwards only SIGTERM to its tasks; the job goes on "
                    "(signal its tasks themselves to have them checkpoint)")
        subprocess.run(["scancel", f"--signal={cfg.checkpoint.signal}", str(job.job_id)], capture_output=True)
        return (f"passed to job {job.job_id} (scancel --signal={cfg.checkpoint.signal}): its ranks checkpoint and "
                "the job is requeued")

    with forwarding(cfg.checkpoint.signal, forward):
        return _follow_job(job, cfg, after, on_slurm)


def _follow_job(job, cfg: RunConfig, after, on_slurm: bool) -> int:
    from submitit.core.utils import FailedJobError, UncompletedJobError

    offset, last_asked = 0, time.monotonic()
    try:
        while not job.done():
            offset = _follow(job.paths.stdout, offset)
            if on_slurm and time.monotonic() - last_asked >= cfg.launch.state_poll_s:
                last_asked = time.monotonic()
                if job.watcher.is_done(job.job_id, mode="force"):
                    break
            time.sleep(cfg.launch.poll_s)
        _follow(job.paths.stdout, offset)
        state = job.watcher.get_state(job.job_id, mode="force") if on_slurm else job.state
        if state.upper().startswith("CANCELLED"):
            why = ""
            if after is not None and after.state not in ("COMPLETED", "RUNNING", "PENDING"):
                why = f": partitioning job {after.job_id} ended {after.state}\n{after.stderr() or ''}"
            print(f"job {job.job_id} was cancelled ({state}){why}; output folder: {cfg.run_dir}", file=sys.stderr,
                  flush=True)
            return EXIT_FAILED
        if read_failures(Path(cfg.run_dir)):
            return report_failure(Path(cfg.run_dir), "", f"job {job.job_id} failed (state {state})")
        results = job.results()
    except KeyboardInterrupt:
        print(f"\nstopped waiting; job {job.job_id} goes on (output folder: {cfg.run_dir})", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (FailedJobError, UncompletedJobError) as exc:
        print(f"job {job.job_id} failed (state {job.state}):\n{exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    _print_result(results[0])
    return 0


def failure_report(run_dir: Path, fallback: str) -> str:
    """Which ranks failed, and the full error of the one that failed first; a user error, its one line.

    When one rank dies, the others fail next with communication errors
    ("Connection closed by peer"); the earliest failure record is the cause. When that cause
    is something to fix (a user error), its line is the whole report (and the last line): the
    traceback and the other ranks' echoes only with ``HYDRA_FULL_ERROR=1``.
    """
    records = read_failures(run_dir)
    if not records:
        return fallback
    first = records[0]
    if first.get("user_error") and not env.full_error():
        return first["user_error"]
    lines = ["failed ranks:"]
    lines += [f"  {r['who']} on {r['host']}: {_last_line(r['error'])}" for r in sorted(records, key=_by_process)]
    lines += [f"first failure, {first['who']} on {first['host']}:", first["error"].rstrip()]
    if first.get("user_error"):  # the cause is something to fix, not a bug: say it plainly last
        lines.append(first["user_error"])
    return "\n".join(lines)


def _by_process(record: dict) -> tuple:
    """Ranks in rank order, then the sampler servers."""
    return record["who"].startswith("sampler"), record.get("rank", -1), record["who"]


def report_failure(run_dir: Path, fallback: str, headline: str = "") -> int:
    """Print the failure report of a run; the exit code: the user error's (2; 4 diverged) when the first
    failure was one, else 1."""
    report = failure_report(run_dir, fallback)
    print(f"{headline}\n{report}" if headline else report, file=sys.stderr, flush=True)
    records = read_failures(run_dir)
    if records and records[0].get("user_error"):
        return records[0].get("exit_code", EXIT_USER_ERROR)
    return EXIT_FAILED


def _last_line(text: str) -> str:
    """The exception line of a traceback dump (the last line that names an error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not set(ln.strip()) <= {"-"}]
    errs = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)]
    return (errs or lines or ["(no message)"])[-1][:300]


def _follow(path: Path, offset: int) -> int:
    """Print what ``path`` gained since ``offset``; returns the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    if chunk:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(chunk)


# ---------------------------------------------------------------- no cluster: local processes


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


def _run_this_rank(cfg: RunConfig) -> int:
    """This process is one rank that srun or torchrun started: train here."""
    from hpcgnn.rank.job import run_rank

    environ = env.current()
    summary = run_rank(cfg, environ)
    if env.RankEnv.from_environ(environ, (cfg.dist.port_min, cfg.dist.port_max), cfg.dist.master_port).is_main:
        _print_result(summary)
    return 0


def _server_entry(index: int, port: int, cfg: RunConfig, parent: int) -> None:
    """One local sampler server (``launch.sampler_servers``): serves every rank on loopback, then leaves. A user
    error leaves quietly with its code (run_server recorded it: the launcher reports its line, as a rank's)."""
    from hpcgnn.data import prepare
    from hpcgnn.errors import UserError
    from hpcgnn.logs import setup_logging
    from hpcgnn.sampling.server import run_server, trainers_of
    from hpcgnn.trust import run_secret

    _end_with_parent(parent)
    setup_logging(f"server {index}", main=index == 0)
    dbg = cfg.debug
    trainers = trainers_of(index, cfg.launch.sampler_servers, cfg.launch.procs, cfg.graph.mode == "partitioned")
    try:
        run_server(index, port, trainers, cfg.train.sampler_threads or 1, cfg.run_dir, run_secret(cfg.run_dir),
                   prepare=lambda: prepare(cfg.dataset), host="127.0.0.1",
                   fail_batch=dbg.sampler_fail_batch if dbg.sampler_fail_rank == index else -1)
    except UserError as exc:  # (recorded by run_server, for the launcher's report)
        if env.full_error():
            raise
        sys.exit(exc.exit_code)


def _start_servers(cfg: RunConfig, ctx) -> tuple[list, dict[str, str]]:
    """``launch.sampler_servers`` local server processes on free ports, and the variable that tells the ranks."""
    d, servers, ports = cfg.dist, [], []
    for k in range(cfg.launch.sampler_servers):
        port = free_port(env.derive_port(str(time.time_ns() + k), d.port_min, d.port_max), d.port_min, d.port_max)
        if k == 0 and cfg.debug.server_port:
            port = cfg.debug.server_port
        ports.append(port)
        servers.append(ctx.Process(target=_server_entry, args=(k, port, cfg, os.getpid()),
                                   name=f"hpcgnn-sampler-server-{k}"))
    listed = ",".join(f"127.0.0.1:{p}" for p in ports)
    return servers, ({env.VARIABLES["local_servers"]: listed} if servers else {}) | {env.VARIABLES["run_locked"]: "1"}


def _spawn_entry(local_rank: int, cfg: RunConfig, port: int, parent: int, extra: dict | None = None) -> None:
    """One local rank. A failure it recorded (run_rank) is the launcher's to report, once for the run: the rank
    leaves quietly with its exit code (its traceback stays in the record; ``HYDRA_FULL_ERROR=1`` prints it here
    too). An unrecorded one keeps multiprocessing's traceback on stderr."""
    from hpcgnn.errors import UserError
    from hpcgnn.rank.job import run_rank

    _end_with_parent(parent)
    from hpcgnn.rank.checkpoint import catch_early

    catch_early(cfg.checkpoint.signal)  # the launcher passes its preemption signal on, maybe before training starts
    try:
        run_rank(cfg, {**env.local_rank_environ(local_rank, cfg.launch.procs, port), **(extra or {})})
    except Exception as exc:
        if not getattr(exc, "recorded", False) or env.full_error():
            raise
        sys.exit(exc.exit_code if isinstance(exc, UserError) else EXIT_FAILED)


def _end_with_parent(parent: int) -> None:
    """A local run's rank or server: Ctrl-C is ignored (a terminal sends it to the whole process group; the
    launcher acts on it and stops the run). Linux: SIGTERM this process when the one that started it dies,
    even by SIGKILL (no orphan ranks holding the graph and the cores after a killed launcher)."""
    process.ignore_signals(signal.SIGINT)
    process.die_with_parent(signal.SIGTERM, parent)


def _spawn_local(cfg: RunConfig, grace_s: float = 3.0) -> int:
    """``launch.procs`` ranks as spawned processes (the standard library's: this process needs no torch).

    The first rank to fail ends the run: the others get ``grace_s`` to notice (their collectives
    break) and record their own failures, then are terminated. Preemption: every rank exits with
    EXIT_PREEMPTED after the checkpoint, and so does this process.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    d = cfg.dist
    port = d.master_port or free_port(env.derive_port(str(time.time_ns()), d.port_min, d.port_max), d.port_min,
                                      d.port_max)
    print(f"starting {cfg.launch.procs} local processes; output folder: {cfg.run_dir}", flush=True)
    ctx = multiprocessing.get_context("spawn")
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
        _print_result(json.load(f))
    return 0
