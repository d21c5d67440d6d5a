"""Which producer makes a rank's training batches, chosen once, here: the rank itself, its sampler processes, or
its sampler servers (each a :class:`~hpcgnn.sampling.protocol.BatchSource`).

The graph side (the store) hands over only what batches are made of (:class:`GraphSide`: where feature rows come
from, the training sampler, and a partitioned graph's exchange); the settings come from the run's config and the
rank's environment, read once (:class:`ProducerSettings`). The trainer owns the source: it starts it before the
first epoch, asks it for each epoch's batches (``source.epoch(store.train_plan(...))``), and closes it at the end.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch

from hpcgnn import trust
from hpcgnn.config import RunConfig
from hpcgnn.env import RankEnv
from hpcgnn.errors import AllocationError
from hpcgnn.sampling import shipping
from hpcgnn.sampling.loader import InRank
from hpcgnn.sampling.protocol import BatchSource


@dataclass(frozen=True)
class GraphSide:
    """What a store hands a producer: what its batches are made of."""

    features: object  # where a batch's rows come from (the graph, its copy on the GPU, a partitioned rank's)
    sampler: object  # the training sampler (hpcgnn.sampling.protocol.Sampler)
    exchange: object | None = None  # a partitioned graph's: the samplers fetch across parts with it (None: whole)
    state: shipping.SamplerState | None = None  # what its sampler servers build the sampler from (None: they cannot)


@dataclass(frozen=True)
class ProducerSettings:
    """What decides the producer and how it runs, read once from the config and the rank's environment."""

    sampler_procs: int  # train.sampler_procs: processes per rank (0: none)
    servers: tuple[tuple[str, int], ...]  # (host, port) of the job's sampler servers (none: none)
    prefetch: int  # train.prefetch: batches ahead (a pool's slots: in flight per producer)
    threads: int  # train.sampler_threads: each sampler process's or server's threads
    keep_freed_memory: bool  # train.keep_freed_memory (the processes' malloc policy)
    fail_batch: int  # debug.sampler_fail_batch where debug.sampler_fail_rank is this rank, else -1
    run_dir: str  # where the run's secret and recipes are, and where servers record failures
    rank: int
    world_size: int
    local_world_size: int
    master_addr: str  # a partitioned graph's samplers meet through the trainers' rendezvous
    master_port: int
    init_timeout_s: float  # dist.init_timeout_s: waiting for servers to start, a group to form
    timeout_s: float  # dist.timeout_s: a batch or collective past the first

    @classmethod
    def of(cls, cfg: RunConfig, env: RankEnv) -> ProducerSettings:
        """Read from the config and the environment; a pool's slots are checked against this node here (ranks
        started by hand have not met the submit-time check: :func:`hpcgnn.checks.check_slots`)."""
        t, d, dbg = cfg.train, cfg.dist, cfg.debug
        settings = cls(t.sampler_procs, tuple(servers_of(cfg, env)), t.prefetch, t.sampler_threads or 1,
                       t.keep_freed_memory, dbg.sampler_fail_batch if dbg.sampler_fail_rank == env.rank else -1,
                       str(cfg.run_dir), env.rank, env.world_size, env.local_world_size, env.master_addr,
                       env.master_port, d.init_timeout_s, d.timeout_s)
        if settings.sampler_procs or settings.servers:
            from hpcgnn.checks import check_slots, shm_free
            from hpcgnn.env import available_memory

            check_slots(cfg, env.local_world_size, shm_free(), available_memory(), f"node {socket.gethostname()}")
        return settings

    def group(self, graph: GraphSide) -> dict | None:
        """A partitioned graph's sampler group: its rendezvous (None: a whole graph, or one rank)."""
        if graph.exchange is None or self.world_size == 1:
            return None
        return dict(group_size=self.world_size, master_addr=self.master_addr, master_port=self.master_port,
                    init_timeout_s=self.init_timeout_s, timeout_s=self.timeout_s)


def servers_of(cfg: RunConfig, env: RankEnv) -> list[tuple[str, int]]:
    """(host, port) of the job's sampler servers, [] when there are none: a heterogeneous job's group 1 or a
    local launcher's (from the environment), or a separate job's (``cluster.samplers.het: false``: the
    addresses its servers write into the run folder)."""
    c = cfg.cluster
    if env.sampler_servers:
        return list(env.sampler_servers)
    if c is None or not c.samplers.nodes or env.source != "slurm":
        return []
    if c.samplers.het:
        raise AllocationError(f"cluster.samplers asks for {c.samplers.nodes} sampler node(s), but this job is not "
                              "heterogeneous (no SLURM_JOB_NODELIST_HET_GROUP_1). HINT: let hpcgnn submit it "
                              "(python -m hpcgnn +cluster=NAME), or set cluster.samplers.het=false where the site "
                              "refuses heterogeneous jobs")
    from hpcgnn.sampling.client import announced_servers

    return announced_servers(trust.announced(cfg.run_dir), c.samplers.nodes * c.samplers.tasks_per_node,
                             cfg.dist.init_timeout_s)


def choose(settings: ProducerSettings, graph: GraphSide, transform, device: torch.device) -> BatchSource:
    """The rank's batch source: its sampler servers', its sampler processes', or its own (a loader with its
    prefetch thread). ``transform``: the model's per-batch transform, given here once."""
    s = settings
    if not (s.sampler_procs or s.servers):
        return InRank(graph.features, graph.sampler, transform, device, s.prefetch)
    stats = graph.exchange.stats if graph.exchange is not None else None
    if s.servers:  # another group of the job, another job, or local processes
        from hpcgnn.sampling.client import RemotePool

        if graph.state is None:
            raise RuntimeError("this store's batches cannot be made by sampler servers: it gives no sampler state")
        return RemotePool(graph.state, list(s.servers), s.prefetch, device, rank=s.rank,
                          key=trust.run_secret(s.run_dir), run_dir=s.run_dir, stats=stats, timeout_s=s.timeout_s,
                          connect_s=s.init_timeout_s, group=s.group(graph))
    from hpcgnn.sampling.procs import SamplerPool

    return SamplerPool(shipping.Recipe(graph.features, graph.sampler, transform, stats), s.sampler_procs, s.prefetch, s.threads, device, rank=s.rank,
                       keep_freed=s.keep_freed_memory, group=s.group(graph), fail_batch=s.fail_batch)

