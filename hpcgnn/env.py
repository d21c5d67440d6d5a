"""Where a rank is, and everything else hpcgnn reads from the environment.

This module is the only reader of environment variables. Two tables say what is read:

- :data:`SOURCES`: per launcher, the variable of each rank role (rank, world size, ...),
  from which one frozen :class:`RankEnv` is made. Sources, in the order they are tried:
  ``torchrun`` (torchrun / torch.distributed.run, and hpcgnn's own local spawn),
  ``submitit_local`` (submitit's LocalExecutor, ``SUBMITIT_LOCAL_*``), ``slurm`` (a task
  that ``srun`` started), ``single`` (one plain process).
- :data:`VARIABLES`: every other variable, by role (the requeue count, CPUs and memory of
  the allocation, whether a shell is interactive, the user's config folder).

Nothing here writes ``os.environ`` but :func:`apply_process_defaults` and :func:`gloo_on_loopback` (the
tables of variables hpcgnn sets, :data:`PROCESS_DEFAULTS` and :data:`LOOPBACK_DEFAULTS`, where the user has not): every function takes the mapping it reads
(default: this process's environment).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcgnn.errors import AllocationError
from hpcgnn.nodes import PORTS, derive_port, expand_nodelist, expand_tasks_per_node, server_port

# role -> variable, one table per source. A role missing from a table is derived.
SOURCES: dict[str, dict[str, str]] = {
    "torchrun": {
        "rank": "RANK",
        "local_rank": "LOCAL_RANK",
        "world_size": "WORLD_SIZE",
        "local_world_size": "LOCAL_WORLD_SIZE",
        "node_rank": "GROUP_RANK",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT",
        "job_id": "TORCHELASTIC_RUN_ID",
    },
    "submitit_local": {
        "rank": "SUBMITIT_LOCAL_GLOBALID",
        "local_rank": "SUBMITIT_LOCAL_LOCALID",
        "world_size": "SUBMITIT_LOCAL_NTASKS",
        "node_rank": "SUBMITIT_LOCAL_NODEID",
        "num_nodes": "SUBMITIT_LOCAL_JOB_NUM_NODES",
        "job_id": "SUBMITIT_LOCAL_JOB_ID",
    },
    "slurm": {
        "rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "world_size": "SLURM_NTASKS",
        "node_rank": "SLURM_NODEID",
        "num_nodes": "SLURM_JOB_NUM_NODES",
        "nodelist": "SLURM_JOB_NODELIST",
        "tasks_per_node": "SLURM_TASKS_PER_NODE",
        "job_id": "SLURM_JOB_ID",
    },
}
# The variables whose presence selects a source.
_MARKERS = {
    "torchrun": ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"),
    "submitit_local": ("SUBMITIT_LOCAL_JOB_ID", "SUBMITIT_LOCAL_GLOBALID"),
    "slurm": ("SLURM_JOB_ID", "SLURM_PROCID"),
}

# role -> variable: everything else hpcgnn reads.
VARIABLES: dict[str, str] = {
    "config_dir": "HPCGNN_CONFIG_DIR",  # the user's config folder (cluster/, model/, dataset/ files)
    "restart_count": "SLURM_RESTART_COUNT",  # times SLURM requeued this job
    "slurm_job_id": SOURCES["slurm"]["job_id"],  # the job (or allocation, for a shell inside one) this process runs in
    "cpus_per_task": "SLURM_CPUS_PER_TASK",  # CPUs of each task (sbatch --cpus-per-task)
    "cpus_on_node": "SLURM_CPUS_ON_NODE",  # CPUs the job has on this node
    "mem_per_node_mb": "SLURM_MEM_PER_NODE",  # sbatch --mem, MB
    "mem_per_cpu_mb": "SLURM_MEM_PER_CPU",  # sbatch --mem-per-cpu, MB
    "job_tasks": "SLURM_NTASKS",  # tasks of the allocation (also set in the batch step)
    "step_id": "SLURM_STEP_ID",  # srun step of this task
    "step_tasks": "SLURM_STEP_NUM_TASKS",  # tasks of this srun step (set by srun only)
    "job_name": "SLURM_JOB_NAME",  # bash / interactive for srun --pty bash and salloc shells
    "pty_port": "SLURM_PTY_PORT",  # set by srun --pty: a terminal, not a rank
    "torchrun_id": "TORCHELASTIC_RUN_ID",  # torchrun's run id ("none" unless --rdzv-id)
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "full_error": "HYDRA_FULL_ERROR",  # 1: print the traceback of a user error too (Hydra's own switch)
    "cpu_flags": "HPCGNN_CPU_FLAGS",  # the CPU flags to decide by instead of /proc/cpuinfo's (tests: the other CPU kind)
    # Sampler servers (docs/samplers.md). In a heterogeneous job, group 0 runs the trainers and group 1 the servers:
    "het_size": "SLURM_HET_SIZE",  # components of a heterogeneous job (set in its steps)
    "server_nodelist": "SLURM_JOB_NODELIST_HET_GROUP_1",  # the sampler servers' nodes
    "server_tasks_per_node": "SLURM_TASKS_PER_NODE_HET_GROUP_1",  # their tasks per node, e.g. 2(x3)
    "trainer_nodelist": "SLURM_JOB_NODELIST_HET_GROUP_0",  # the trainers' nodes (a server binds where they reach it)
    "node_name": "SLURMD_NODENAME",  # this task's node, as SLURM names it
    "het_job_id": "SLURM_JOB_ID_HET_GROUP_0",  # the job's leader id: the servers' ports derive from it
    "task_rank": "SLURM_PROCID",  # a server's index among the servers (its own step)
    "task_local": "SLURM_LOCALID",  # ... and on its node
    "local_servers": "HPCGNN_SAMPLER_SERVERS",  # host:port,... of local sampler servers (set by the local launcher)
    "run_locked": "HPCGNN_RUN_LOCKED",  # 1: the local launcher holds the run folder's lock (hpcgnn/runlock.py), not rank 0
    # The C sampling kernels (hpcgnn/kernels/build.py), built at install, else on first use into a cache:
    "native": "HPCGNN_NATIVE",  # 0: sample on torch ops only (the same batches, slower)
    "c_compiler": "CC",  # the C compiler that builds them on first use (default cc)
    "native_cache": "HPCGNN_NATIVE_CACHE",  # where those are kept (a folder only you may write)
    "cache_home": "XDG_CACHE_HOME",  # ... default $XDG_CACHE_HOME/hpcgnn/native (XDG_CACHE_HOME default ~/.cache)
    # Trackers (docs/tracking.md):
    "mlflow_uri": "MLFLOW_TRACKING_URI",  # where MLflow writes (unset: a file store in the run's or group's folder)
    "mlflow_file_store": "MLFLOW_ALLOW_FILE_STORE",  # true: MLflow accepts a file store (it refuses one otherwise)
}
# Variables hpcgnn sets for its own processes and those they start, unless the user did. Read by libraries
# once, when they load; hpcgnn/__init__.py applies them before anything imports torch.
PROCESS_DEFAULTS: dict[str, str] = {
    # OpenMP threads waiting at a barrier sleep instead of spinning. With a core taken by another process
    # (a rank's own sampler processes or prefetch thread, a neighbour on a shared node) spinning teams made
    # the loaders 2.6x slower and passive ones 1.4x (benchmarks/sampler.py --contended); quiet, no slower.
    "OMP_WAIT_POLICY": "PASSIVE",
}
# Where master ports are derived (dist.port_min/port_max): below Linux's ephemeral range, which starts at 32768.
# Job names of shells a user types in (Lightning's rule, with the common shells).
INTERACTIVE_JOB_NAMES = ("bash", "sh", "zsh", "fish", "tcsh", "csh", "ksh", "interactive")


APPLIED: set[str] = set()  # the keys apply_process_defaults set in this process (the user had not)


def apply_process_defaults(environ: dict | None = None) -> None:
    """Set :data:`PROCESS_DEFAULTS` in ``environ`` (this process's environment), keeping what is set."""
    environ = os.environ if environ is None else environ
    for key, value in PROCESS_DEFAULTS.items():
        if key not in environ:
            environ[key] = value
            APPLIED.add(key)


LOOPBACK_DEFAULTS: dict[str, str] = {
    # gloo listens for its peers on the interface this names (else: the one the host's name resolves to). A run
    # whose ranks all meet on this machine's loopback needs nothing else, and nothing else is reachable.
    "GLOO_SOCKET_IFNAME": "lo",
}


def gloo_on_loopback(environ: dict | None = None) -> None:
    """Set :data:`LOOPBACK_DEFAULTS` in ``environ`` (this process's environment), keeping what the user set: a run
    whose ranks all meet on 127.0.0.1 (before its process group is made)."""
    environ = os.environ if environ is None else environ
    for key, value in LOOPBACK_DEFAULTS.items():
        if key not in environ:
            environ[key] = value
            APPLIED.add(key)


def current() -> Mapping[str, str]:
    """This process's environment, read-only in spirit: pass it to the functions here."""
    return os.environ


def local_rank_environ(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of local process ``rank`` that ``python -m hpcgnn`` starts itself (torchrun's table)."""
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


# Variables of the job we are in, which a job submitted from here must not inherit (sbatch exports
# the environment, and srun in the new job would read e.g. SLURM_MEM_PER_CPU next to its own
# SLURM_MEM_PER_NODE). SLURM_CONF says where the cluster is and stays.
_JOB_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SALLOC_", "SUBMITIT_")
_KEEP = ("SLURM_CONF",)


@contextlib.contextmanager
def outside_job() -> Iterator[None]:
    """While submitting: this process's environment without the variables of the job it runs in.

    The one place hpcgnn writes ``os.environ``; everything is restored on exit.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith(_JOB_PREFIXES) and k not in _KEEP}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def read(role: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of ``role``'s variable (see :data:`VARIABLES`), or None when unset."""
    return (os.environ if environ is None else environ).get(VARIABLES[role])


def read_int(role: str, environ: Mapping[str, str] | None = None) -> int | None:
    value = read(role, environ)
    return int(value) if value is not None and value.strip().isdigit() else None


def user_config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's config folder: $HPCGNN_CONFIG_DIR, default ~/.config/hpcgnn."""
    return Path(read("config_dir", environ) or Path.home() / ".config" / "hpcgnn").expanduser()


def cache_home(environ: Mapping[str, str] | None = None) -> Path:
    """The user's cache folder: $XDG_CACHE_HOME, default ~/.cache."""
    return Path(read("cache_home", environ) or Path.home() / ".cache")


def full_error(environ: Mapping[str, str] | None = None) -> bool:
    """Whether user errors come with their traceback (``HYDRA_FULL_ERROR=1``)."""
    return read("full_error", environ) == "1"


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """Times SLURM requeued this job (0 outside SLURM)."""
    return read_int("restart_count", environ) or 0


def slurm_cpus_per_task(environ: Mapping[str, str] | None = None) -> int | None:
    return read_int("cpus_per_task", environ)


def slurm_memory_limit(environ: Mapping[str, str] | None = None) -> int | None:
    """Bytes SLURM allows this job on this node (--mem, or --mem-per-cpu x its CPUs), or None."""
    per_node = read_int("mem_per_node_mb", environ)
    if per_node:
        return per_node * 2**20
    per_cpu, cpus = read_int("mem_per_cpu_mb", environ), read_int("cpus_on_node", environ)
    if per_cpu and cpus:
        return per_cpu * cpus * 2**20
    return None


def available_memory() -> int:
    """Bytes this process may still allocate: MemAvailable, capped by a cgroup limit and SLURM's."""
    limits = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            usage = next((Path(path).with_name(n) for n in ("memory.current", "memory.usage_in_bytes")
                          if Path(path).with_name(n).exists()), None)
            used = int(usage.read_text()) if usage is not None else 0
            limits.append(int(text) - used)
    slurm = slurm_memory_limit()
    if slurm is not None:
        limits.append(slurm)
    return min(limits) if limits else 2**62


def cpu_flags(cpuinfo: str | None = None, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """This CPU's feature flags as Linux lists them (``amx_bf16``, ``avx512_bf16``, ...; empty elsewhere), or
    those of a recorded ``cpuinfo`` file.

    ``HPCGNN_CPU_FLAGS`` (space-separated flags), when set, replaces this CPU's: what hpcgnn decides from the
    CPU (``train.precision=auto``) is then decided as on a CPU with those flags, e.g. ``HPCGNN_CPU_FLAGS=avx2``
    for an AVX2-only CPU (fp32) or ``HPCGNN_CPU_FLAGS="avx2 avx512_bf16"`` for one that computes bf16. The
    test suite runs the tests that compare computation paths both ways through it. The kernels torch picks
    do not change: only hpcgnn's own decisions do.
    """
    override = read("cpu_flags", environ) if cpuinfo is None else None
    if override is not None:
        return frozenset(override.split())
    try:
        with open(cpuinfo or "/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def interactive_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process looks like a shell a user types in (srun --pty bash, salloc), or None."""
    if read("pty_port", environ) is not None:
        return "SLURM_PTY_PORT is set (srun --pty)"
    name = read("job_name", environ)
    if name in INTERACTIVE_JOB_NAMES:
        return f"the job is named {name!r} (an interactive shell)"
    return None


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    source: str  # torchrun | submitit_local | slurm | single
    rank: int  # global rank, 0..world_size-1
    local_rank: int  # rank on this node
    world_size: int  # ranks in the job
    local_world_size: int  # ranks on this node
    node_rank: int  # index of this node in the job
    num_nodes: int  # nodes in the job
    hostnames: tuple[str, ...]  # the job's nodes, in SLURM order (this host alone for local sources)
    master_addr: str  # host of rank 0's TCP store
    master_port: int  # port of rank 0's TCP store
    job_id: str  # the launcher's job id ("" when none)
    sampler_servers: tuple[tuple[str, int], ...] = ()  # (host, port) of the job's sampler servers (none: none)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def one_node(self) -> bool:
        """Every rank of the job is on this node (they can share memory instead of sending it)."""
        return self.local_world_size == self.world_size

    def default_threads(self, environ: Mapping[str, str]) -> int:
        """This task's share of the node's CPUs, for torch's threads: SLURM_CPUS_PER_TASK (what the job asked
        for, whether or not SLURM binds the task to those cores), else usable cores / ranks on this node."""
        cpus = slurm_cpus_per_task(environ)
        if cpus and self.source == "slurm":
            return max(1, cpus)
        return max(1, len(os.sched_getaffinity(0)) // self.local_world_size)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], port_range: tuple[int, int] = PORTS,
                     master_port: int = 0) -> RankEnv:
        """Read the rank layout of this process from ``environ``.

        ``master_port`` > 0 overrides the derived port; ``port_range`` bounds the derivation.
        """
        layout = cls._layout(environ, port_range, master_port)
        servers = tuple(sampler_servers(environ, port_range))
        return dataclasses.replace(layout, sampler_servers=servers) if servers else layout

    @classmethod
    def _layout(cls, environ: Mapping[str, str], port_range: tuple[int, int], master_port: int) -> RankEnv:
        source = detect_source(environ)
        if source == "single":
            port = master_port or derive_port(str(os.getpid()), *port_range)
            return cls(source="single", rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       num_nodes=1, hostnames=(socket.gethostname(),), master_addr="127.0.0.1", master_port=port,
                       job_id="")
        table = SOURCES[source]

        def get(role: str, default: str | None = None) -> str:
            var = table.get(role)
            value = environ.get(var) if var else None
            if value is None:
                if default is None:
                    raise AllocationError(f"{source} launch: variable {var} for {role} is not set")
                return default
            return value

        rank, world = int(get("rank")), int(get("world_size"))
        local_rank = int(get("local_rank", "0"))
        job_id = get("job_id", "")
        if source == "torchrun":
            local_world = int(get("local_world_size", str(world)))
            return cls(source=source, rank=rank, local_rank=local_rank, world_size=world,
                       local_world_size=local_world, node_rank=int(get("node_rank", "0")),
                       num_nodes=max(1, world // max(1, local_world)), hostnames=(socket.gethostname(),),
                       master_addr=get("master_addr"), master_port=master_port or int(get("master_port")),
                       job_id=job_id)
        port = master_port or derive_port(job_id, *port_range)
        if source == "submitit_local":
            return cls(source=source, rank=rank, local_rank=local_rank, world_size=world, local_world_size=world,
                       node_rank=int(get("node_rank", "0")), num_nodes=int(get("num_nodes", "1")),
                       hostnames=(socket.gethostname(),), master_addr="127.0.0.1", master_port=port, job_id=job_id)
        # slurm
        if read("step_tasks", environ) is None and world > 1:
            raise AllocationError(
                f"SLURM allocated {world} tasks but only this one is running: the training entry was started "
                "without srun, directly in the batch script. HINT: start it as\n"
                "    srun python -m hpcgnn ...\n"
                "or let hpcgnn submit the job with +cluster=NAME (it adds srun itself)")
        hostnames = tuple(expand_nodelist(get("nodelist")))
        num_nodes = int(get("num_nodes", str(len(hostnames))))
        node_rank = int(get("node_rank", "0"))
        per_node = expand_tasks_per_node(get("tasks_per_node", str(world)))
        local_world = per_node[node_rank] if node_rank < len(per_node) else per_node[-1]
        return cls(source=source, rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                   node_rank=node_rank, num_nodes=num_nodes, hostnames=hostnames, master_addr=hostnames[0],
                   master_port=port, job_id=job_id)


def detect_source(environ: Mapping[str, str] | None = None) -> str:
    """The first source whose marker variables are all set, else ``single``."""
    environ = os.environ if environ is None else environ
    for source, markers in _MARKERS.items():
        if all(m in environ for m in markers):
            return source
    return "single"


def srun_step_tasks(environ: Mapping[str, str] | None = None) -> int | None:
    """Tasks of the srun step that started this process; None outside an srun step."""
    if detect_source(environ) != "slurm":
        return None
    return read_int("step_tasks", environ)


def started_as_rank(environ: Mapping[str, str] | None = None) -> bool:
    """True when torchrun or srun started this process as one rank of a job.

    A one-task srun step that runs a shell a user types in (``srun --pty bash``, a job named
    ``bash`` or ``interactive``) is not a rank: commands typed there submit or start local
    processes like anywhere else. Several tasks in one step are always ranks.
    """
    if detect_source(environ) == "torchrun":
        return True
    tasks = srun_step_tasks(environ)
    if tasks is None:
        return False
    return tasks > 1 or interactive_reason(environ) is None


def run_name(environ: Mapping[str, str] | None = None, now: datetime.datetime | None = None) -> str:
    """The run folder's name, the same on every rank of an externally launched job.

    srun and torchrun start each rank as its own ``python -m hpcgnn``: a
    timestamp would give every rank its own folder.
    """
    environ = os.environ if environ is None else environ
    source = detect_source(environ)
    if source == "slurm" and started_as_rank(environ):
        return f"slurm-{environ[SOURCES['slurm']['job_id']]}.{read('step_id', environ) or 'batch'}"
    if source == "torchrun":
        run_id = read("torchrun_id", environ) or "none"
        if run_id == "none":  # torchrun's default: fall back to what all ranks share
            run_id = f"{read('master_addr', environ)}-{read('master_port', environ)}"
        return f"torchrun-{run_id}"
    return (now or datetime.datetime.now()).strftime("%Y-%m-%d/%H-%M-%S-%f")


def sampler_servers(environ: Mapping[str, str] | None = None, port_range: tuple[int, int] = PORTS
                    ) -> list[tuple[str, int]]:
    """Where this job's sampler servers listen, in server order: the local launcher's list, or a heterogeneous
    job's group 1 (its nodes and tasks per node); [] when there are none."""
    environ = os.environ if environ is None else environ
    listed = read("local_servers", environ)
    if listed:
        return [(host, int(port)) for host, _, port in (item.rpartition(":") for item in listed.split(","))]
    nodes = read("server_nodelist", environ)
    if not nodes or (read_int("het_size", environ) or 0) < 2:
        return []
    job = read("het_job_id", environ) or read("slurm_job_id", environ) or ""
    hosts = expand_nodelist(nodes)
    per_node = expand_tasks_per_node(read("server_tasks_per_node", environ) or "1")
    return [(host, server_port(job, k, *port_range)) for host, n in zip(hosts, per_node, strict=True)
            for k in range(n)]


def this_server(environ: Mapping[str, str] | None = None, port_range: tuple[int, int] = PORTS) -> tuple[int, int]:
    """(index, port) of this sampler server: a task of group 1 of a heterogeneous job (its step's rank and
    local id)."""
    environ = os.environ if environ is None else environ
    job = read("het_job_id", environ) or read("slurm_job_id", environ) or ""
    return int(read("task_rank", environ) or 0), server_port(job, int(read("task_local", environ) or 0), *port_range)
