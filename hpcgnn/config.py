"""Typed configuration.

Every config group owns one frozen dataclass; the task group one per task and the dataset group one per source
(declared beside their specs: :mod:`hpcgnn.specs.tasks`, :mod:`hpcgnn.specs.datasets`), the one its option's name
picks. A setting with a few choices declares them in its annotation (``Literal``), checked as the config is built
(:func:`_build`), and nowhere else. Hydra composes YAML files and
command-line overrides against mutable twins of these classes (OmegaConf makes
frozen dataclasses read-only, so Hydra could not merge into them); the result
becomes a frozen, validated :class:`RunConfig` exactly once, in
:func:`RunConfig.from_dictconfig` (called by :func:`hpcgnn.submit.compose.compose`).
Everything downstream takes a ``RunConfig``.

This module checks values and their combinations only; it imports nothing of hpcgnn but
its errors, the port range env.py derives in, and the specs (samplers, tasks, datasets). The registries' names (models, datasets,
tasks) are checked by :func:`hpcgnn.checks.check_registered_names`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional, Tuple

from omegaconf import MISSING, DictConfig, OmegaConf

from hpcgnn.errors import ConfigError
from hpcgnn.nodes import PORTS
from hpcgnn.specs import declared, samplers
from hpcgnn.specs.datasets import DatasetConfig
from hpcgnn.specs.tasks import TaskConfig

__all__ = ["ConfigError", "DatasetConfig", "RunConfig", "TaskConfig", "check_override_keys", "dataset_config",
           "register_configs"]


@dataclass(frozen=True)
class WidthNames:
    """A model class's own names for the widths hpcgnn fills in (None: the name itself, where the class takes it)."""

    in_channels: Optional[str] = None  # features of a node
    out_channels: Optional[str] = None  # classes (a link model: its embedding, model.hidden_channels)
    hidden_channels: Optional[str] = None  # model.hidden_channels
    num_layers: Optional[str] = None  # len(train.fanouts): one layer per sampled hop
    dropout: Optional[str] = None  # model.dropout
    edge_dim: Optional[str] = None  # the edges' features (where forward takes edge_attr): the graph's width


@dataclass(frozen=True)
class ModelConfig:
    name: str = "sage"  # sage | gcn | gat | gin | mlp | custom (a model of yours: _target_); depth is len(train.fanouts)
    hidden_channels: int = 128  # width of every hidden layer
    dropout: float = 0.3  # dropout probability between layers
    heads: int = 4  # gat: attention heads per layer
    edge_dim: int = 0  # gat, gin: the width of the edges' features they read (GATConv(edge_dim), GINEConv), the graph's; 0: none
    aggregation: Literal["csr", "pyg"] = "csr"  # csr: sage/gcn/gin aggregate sampled batches on the CPU as sorted-CSR products | pyg: PyG's gather/scatter
    _target_: Optional[str] = None  # custom: the model's class, pkg.module.Class (importable in the job: installed, or on PYTHONPATH)
    kwargs: Dict[str, Any] = field(default_factory=dict)  # custom: keyword arguments of the class, besides the widths hpcgnn fills in
    widths: WidthNames = field(default_factory=WidthNames)  # custom: your class's argument for each width hpcgnn fills in, where its names differ
    gcn_norm: bool = False  # custom: batches carry GCN's weights from the whole graph's degrees (edge_weight) and self-loops
    virtual_node: bool = False  # gin on task=graph: a virtual node joined to every node of its graph (OGB's GIN-virtual)


@dataclass(frozen=True)
class GraphConfig:
    mode: str = "replicated"  # replicated: every rank maps the whole graph | partitioned: each rank holds its parts
    num_parts: int = 0  # partitioned: METIS/random parts; 0 = one per rank; else a multiple of the world size
    method: Literal["metis", "lp", "random"] = "metis"  # partitioned: metis (few cut edges, ~110 B per edge in memory) | lp (multilevel label propagation over the mapped graph: METIS's quality, O(nodes) memory) | random (no partitioning cost)
    seed: int = 0  # partitioned: METIS seed; the same graph, num_parts and seed give byte-identical parts
    balance_train: bool = True  # partitioned: balance training nodes across parts as well as nodes
    partition_mem_gb: Optional[float] = None  # memory partitioning may use; None = what this machine has free
    cache_mb: float = 0.0  # partitioned: per-rank budget for features of hot remote nodes (0 = no cache)
    cache_policy: Literal["degree", "frequency"] = "degree"  # partitioned: degree | frequency (measured in a warm-up pass)
    warmup_batches: int = 8  # partitioned, cache_policy=frequency: batches sampled to count remote hits
    boundary_fraction: float = 1.0  # partitioned: keep this fraction of remote neighbours per hop (BNS-GCN)

    def parts_for(self, world_size: int) -> int:
        """How many parts the graph is cut into for ``world_size`` ranks: ``num_parts``, or one per rank."""
        return self.num_parts or world_size


@dataclass(frozen=True)
class TimeConfig:
    respect: bool = True  # a graph whose edges have times: each seed's neighbourhood as of its own time, no edge after it (false: every edge, future ones too: the log says so)
    strategy: Literal["uniform", "last"] = "uniform"  # uniform (among the edges up to the seed's time) | last (the most recent fanout of them, PyG's last)
    window: Optional[float] = None  # only edges at most this much older than their seed, in the times' unit (None: any age)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 8  # passes over the training seeds
    batch_size: int = 512  # seed nodes per rank per step
    fanouts: Tuple[int, ...] = (10, 5)  # neighbours sampled per node, hop 1 first; one GNN layer each
    relation_fanouts: Dict[str, Any] = field(default_factory=dict)  # typed graphs: {src__name__dst: [per hop]} overriding train.fanouts for that relation (0: not sampled)
    sampler: str = "neighbor"  # neighbor | ladies | saint_node | saint_edge | saint_rw | cluster (docs/training.md: samplers)
    edge_budget: int = 0  # sampler=neighbor: cut seeds into batches of about this many sampled edges (0 = batch_size seeds)
    clusters_per_batch: int = 4  # sampler=cluster: METIS clusters whose induced subgraph is one step
    num_clusters: int = 0  # sampler=cluster: clusters of the graph; 0 = clusters_per_batch x train nodes / batch_size
    saint_coverage: float = 20.0  # sampler=saint_rw: mean visits per node when counting inclusion probabilities
    lr: float = 3e-3  # Adam learning rate
    weight_decay: float = 0.0  # Adam weight decay
    lr_schedule: Literal["constant", "cosine"] = "constant"  # constant | cosine (decays to 0 over all steps of the run)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # none | linear | sqrt: multiply lr by (ranks x accumulate), or its square root
    warmup: float = 0.0  # linear LR warmup over this fraction of all optimizer steps
    accumulate: int = 1  # micro-batches per optimizer step (DDP all-reduces once per step)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto (bf16 where the CPU has AMX/AVX512-BF16 or the GPU bf16, else fp32) | fp32 | bf16 (autocast) | fp16 (autocast + gradient scaler, GPU)
    grad_compression: Literal["none", "fp16", "bf16", "powersgd"] = "none"  # none | fp16 | bf16 | powersgd: DDP communication hook
    powersgd_rank: int = 2  # grad_compression=powersgd: rank of the low-rank approximation
    eval_mode: Literal["auto", "sampled", "full"] = "auto"  # auto (full on replicated graphs with hpcgnn's models, which run layer by layer; else sampled) | sampled (like training) | full (layer-wise, all neighbours: exact)
    eval_chunk: int = 8192  # eval_mode=full: target nodes per chunk
    seed: int = 0  # seeds the model init, the seed order and the sampler
    eval_every: int = 1  # evaluate on val/test every N epochs (and after the last)
    select: Literal["val", "last"] = "val"  # the epoch whose metrics the summary reports: val (the best validation metric) | last (the last evaluated: a graph with no validation split)
    eval_batch_size: int = 2048  # seed nodes per evaluation step
    num_threads: int = 0  # torch intra-op threads per rank (with sampler processes: theirs and the rank's together); 0 = CPUs of the task / local ranks
    keep_freed_memory: bool = True  # malloc reuses freed blocks: no page faults on per-batch buffers (glibc); exact inference keeps its node-shared tables between evaluations
    prefetch: int = 2  # batches sampled ahead in a background thread (0 = sample inside the training loop); with sampler processes: slots per process
    sampler_procs: int = 0  # processes per rank that sample and gather training batches beside the training loop (0 = the prefetch thread); docs/samplers.md
    sampler_threads: int = 0  # torch threads of each sampler process; 0 = an equal share of the rank's cores (train.num_threads or the task's CPUs), the rank keeping the rest
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto (cuda:<local_rank> when CUDA is present, else cpu) | cpu | cuda
    graph_on: Literal["auto", "host", "device"] = "auto"  # where a replicated rank samples: host | device (CSR, features, labels copied to its GPU once) | auto (device when on a GPU, sampler=neighbor, task=node (any kind) and the graph takes at most graph_on_fraction of the GPU's memory)
    graph_on_fraction: float = 0.5  # graph_on=auto: largest share of the GPU's memory the graph may take (shared by the ranks on that GPU)
    nonfinite: Literal["stop", "skip"] = "stop"  # a NaN/inf loss or gradient: stop (the run fails, naming the step and rank) | skip (that optimizer step is skipped and counted)


@dataclass(frozen=True)
class DistConfig:
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto (nccl when every rank has a GPU of its own; gloo on CPU or when ranks share a GPU) | nccl | gloo
    init_timeout_s: float = 1800.0  # seconds a collective may wait until the first training step succeeded (rendezvous, data preparation, partitioning on local rank 0)
    timeout_s: float = 120.0  # seconds a collective may wait after that: a hung rank fails the job this soon
    master_port: int = 0  # 0 = derive from the job id inside port_min..port_max
    port_min: int = PORTS[0]  # lowest derived port
    port_max: int = PORTS[1]  # highest derived port (Linux's ephemeral range starts at 32768)


@dataclass(frozen=True)
class SamplerNodesConfig:
    """Sampler servers in the same job (docs/training.md): nodes that hold the graph and make the trainers' batches."""

    nodes: int = 0  # nodes of sampler servers (0: none; the ranks sample themselves)
    tasks_per_node: int = 1  # servers per node
    cpus_per_task: int = 0  # cores of each server (0: cluster.cpus_per_task)
    mem_gb: Optional[float] = None  # memory per sampler node in GB (None = partition default)
    partition: Optional[str] = None  # None: the trainers' partition
    het: bool = True  # one heterogeneous job (trainers group 0, servers group 1); false: a second job started beside the trainers', for sites that refuse heterogeneous jobs


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "cluster"  # label used in logs and job names
    executor: Literal["slurm", "local"] = "slurm"  # slurm (sbatch via submitit) | local (submitit's local executor)
    partition: Optional[str] = None  # sbatch --partition
    account: Optional[str] = None  # sbatch --account
    qos: Optional[str] = None  # sbatch --qos
    nodes: int = 1  # nodes per job
    tasks_per_node: int = 1  # ranks per node; must equal gpus_per_node on GPU clusters
    gpus_per_node: int = 0  # GPUs per node (0 = CPU-only cluster)
    cpus_per_task: int = 2  # CPU cores per rank
    mem_gb: Optional[float] = None  # memory per node in GB (None = partition default)
    time_min: int = 60  # wall-clock limit in minutes
    constraint: Optional[str] = None  # sbatch --constraint, e.g. "a100"
    exclude: Optional[str] = None  # sbatch --exclude node list
    job_name: str = "hpcgnn"  # sbatch --job-name
    sbatch_extra: dict[str, str] = field(default_factory=dict)  # more sbatch options, {option: value}
    setup: Tuple[str, ...] = ()  # shell lines run before srun (module load ..., source venv/bin/activate)
    signal_delay_s: int = 120  # seconds before the time limit at which SLURM sends USR2
    samplers: SamplerNodesConfig = field(default_factory=SamplerNodesConfig)  # sampler server nodes in the same job


@dataclass(frozen=True)
class LaunchConfig:
    mode: Literal["auto", "submit", "local", "rank"] = "auto"  # auto (guess from the environment) | submit (to +cluster) | local (launch.procs here) | rank (train in this process, one rank of srun/torchrun)
    dry_run: bool = False  # print the job script and the resolved config, submit nothing
    wait: Optional[bool] = None  # wait for the job(s) and print the result; default: a run waits, a sweep (-m) does not
    procs: int = 2  # processes on this machine when no +cluster is given
    sampler_servers: int = 0  # local runs: sampler server processes beside the ranks, making their training batches (docs/training.md); on SLURM: the cluster file's samplers group
    poll_s: float = 2.0  # seconds between checks for result files while waiting
    state_poll_s: float = 10.0  # seconds between asking the scheduler (sacct) for the job state


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0  # also checkpoint every N training steps (0 = off)
    every_minutes: float = 30.0  # ... and every M minutes of training (0 = off)
    keep: int = 3  # newest checkpoints kept in <run_dir>/checkpoints
    resume: bool = True  # start from the newest valid checkpoint in the run folder, if any
    signal: str = "USR2"  # preemption / time-limit signal: checkpoint at the next step, then requeue
    max_timeouts: int = 3  # requeues after hitting the time limit before giving up (preemptions: unlimited)


@dataclass(frozen=True)
class MetricsConfig:
    every_steps: int = 10  # logging steps: read timings and losses (device syncs) and write step records every N steps
    straggler_factor: float = 1.5  # warn when a rank's p95 step time exceeds the median rank's by this factor
    tensorboard: bool = True  # rank 0 writes <run_dir>/tensorboard
    progress_bar: Literal["auto", "on", "off"] = "auto"  # auto (on a terminal only) | on | off; rank 0 only
    trackers: Tuple[str, ...] = ()  # wandb and/or mlflow, besides TensorBoard and the JSON lines (optional extras: pip install 'hpcgnn[wandb]'); docs/tracking.md
    project: str = "hpcgnn"  # the W&B project and the MLflow experiment
    group: str = ""  # set by a sweep's or a tune's launcher (its folder): a W&B group, an MLflow parent run


@dataclass(frozen=True)
class DebugConfig:
    fail_rank: int = -1  # fault injection for tests: this rank raises ...
    fail_step: int = 1  # ... just before this (1-based, global) training step
    hang_rank: int = -1  # this rank stops responding (sleeps) ...
    hang_step: int = 1  # ... just before this step
    slow_rank: int = -1  # this rank sleeps debug.slow_s before every step (a straggler)
    slow_s: float = 0.0
    delay_rank: int = -1  # this rank sleeps debug.delay_s before the first step only (a slow start)
    delay_s: float = 0.0
    sampler_fail_rank: int = -1  # this rank's sampler process (train.sampler_procs) raises ...
    sampler_fail_batch: int = 0  # ... making this batch (0-based index in an epoch; the process making it raises)
    signal_rank: int = -1  # this rank sends itself checkpoint.signal ...
    signal_step: int = 1  # ... just before this step (a preemption, in-process)
    nan_rank: int = -1  # this rank's loss becomes NaN ...
    nan_step: int = 1  # ... at this step (a diverging run)
    server_port: int = 0  # local sampler server 0 listens on this port, free or not (tests: a port another process holds); 0: a free one


@dataclass(frozen=True)
class PredictConfig:
    """Set by ``hpcgnn predict RUN_DIR`` (hpcgnn.submit.predict), not by hand: the job then infers, not trains."""

    model_file: Optional[str] = None  # the trained run's model/best.pt or model/last.pt; None: a training job
    what: Literal["predictions", "embeddings", "scores"] = "predictions"  # predictions (class probabilities and labels) | embeddings (the last hidden layer; a link model's encoder output) | scores (a link model's, of predict.pairs)
    split: Literal["train", "val", "test", "all"] = "test"  # train | val | test | all: the nodes written (a typed graph: of its labelled type)
    mode: Literal["auto", "full", "sampled"] = "auto"  # auto (the run's own evaluation path) | full (exact, layer-wise) | sampled (the evaluation's batches)
    allow_other_graph: bool = False  # infer on a graph other than the run's (inductive), where its widths match
    pairs: Optional[str] = None  # a .npy file of node pairs ([P, 2] or [2, P] ids): a link model scores them, an edge model predicts them
    at: Optional[float] = None  # a timed graph's outputs as of this time: exact, from the edges before it alone (docs/temporal.md)
    trust: bool = False  # the trained run's folder may be another user's (hpcgnn predict RUN_DIR trust=true); a model class's package must be writable only by you or root either way


@dataclass(frozen=True)
class TuneConfig:
    """``hpcgnn tune``: a search over the overrides' sweep grammar (docs/tuning.md); ``trial`` and ``study`` are set
    by its workers, not by hand."""

    trials: int = 20  # trials the study ends after (completed or pruned; failed ones are tried again once)
    parallel: int = 2  # workers pulling trials at once (a SLURM job array of this many; local processes without a cluster)
    sampler: Literal["tpe", "random"] = "tpe"  # tpe (Optuna's TPE, seeded) | random
    seed: int = 0  # the sampler's seed
    pruner: Literal["asha", "hyperband", "median", "none"] = "asha"  # asha | hyperband | median | none: which trials stop early, from their per-epoch metric
    metric: str = "auto"  # what each epoch reports and the study optimises: auto (the task's val metric) | val_<name>
    direction: Literal["auto", "minimize", "maximize"] = "auto"  # auto (the metric's own: minimize RMSE, maximize the rest) | minimize | maximize
    min_epochs: int = 1  # epochs every trial runs before a pruner may stop it
    reduction_factor: int = 4  # asha, hyperband: 1 in this many trials goes on at each rung (Optuna's, Ray's ASHA)
    trial: int = -1  # set by a tune's worker: this run is that trial of the study (-1: not a trial)
    study: str = ""  # set by a tune's worker: the study's journal file (the sweep folder's study.journal)


@dataclass(frozen=True)
class RunConfig:
    task: TaskConfig = MISSING
    dataset: DatasetConfig = MISSING
    model: ModelConfig = MISSING
    graph: GraphConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    time: TimeConfig = field(default_factory=TimeConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    cluster: Optional[ClusterConfig] = None  # absent: run launch.procs processes on this machine
    run_dir: str = ""  # where logs, summary.json and job files go; "" = hydra.run.dir (a sweep: hydra.sweep.dir/subdir)

    @classmethod
    def from_dictconfig(cls, cfg: DictConfig) -> RunConfig:
        """Resolve Hydra's composed config into a frozen, validated RunConfig."""
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run = _build(cls, data, "")
        run.validate()
        return run

    def to_json(self) -> bytes:
        """Its fields as JSON (:meth:`from_json` reads them back): for a process that must not unpickle."""
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RunConfig:
        """The config :meth:`to_json` wrote, built field by field into its frozen classes."""
        return _build(cls, json.loads(data), "")

    @property
    def world_size(self) -> int:
        """Ranks the job is configured for."""
        if self.cluster is None:
            return self.launch.procs
        return self.cluster.nodes * self.cluster.tasks_per_node

    def _validate_servers(self) -> None:
        """Sampler servers against the ranks they serve, and against sampler processes."""
        from hpcgnn.checks import sampler_servers

        if self.launch.sampler_servers < 0:
            raise ConfigError(f"launch.sampler_servers={self.launch.sampler_servers} must be 0 (none) or more")
        servers, t = sampler_servers(self), self.train
        if servers and t.sampler_procs:
            raise ConfigError(f"train.sampler_procs={t.sampler_procs} with {servers} sampler server(s): the servers make "
                              "every training batch, and the rank's sampler processes would only take its cores. HINT: "
                              "set train.sampler_procs=0, or use no sampler servers")
        if servers > self.world_size and self.graph.mode == "partitioned":
            raise ConfigError(f"{servers} sampler servers for {self.world_size} rank(s) on a partitioned graph: server "
                              f"k makes the batches of ranks k, k+{servers}, ..., so a server past the ranks would wait "
                              f"for a trainer that never comes. HINT: at most {self.world_size} sampler server(s)")

    def validate(self) -> None:
        """Cross-field checks, each naming the setting to change: one check per group, then those across groups."""
        for key, value in _numbers(self, ""):
            if not math.isfinite(value):
                raise ConfigError(f"{key}={value} is not a finite number: a run with it would train to NaN or stop "
                                  f"at once. HINT: give {key} a finite value")
        _validate_graph(self.graph, self.world_size)
        _validate_train(self.train)
        _validate_run(self)
        _validate_sampler(self.train, self.graph)
        self._validate_servers()
        _validate_checkpoint(self.checkpoint)
        if not 0 <= self.model.dropout < 1:
            raise ConfigError(f"model.dropout={self.model.dropout} must be in [0, 1)")
        _validate_graph_on(self)
        if not 1024 <= self.dist.port_min < self.dist.port_max <= 65535:
            raise ConfigError(f"dist.port_min..dist.port_max={self.dist.port_min}..{self.dist.port_max} "
                              "must be an increasing range inside 1024..65535")
        if self.cluster is not None:
            _validate_cluster(self.cluster)
        self.dataset.check(self.task.name, self.train.select)


def _or(words: tuple[str, ...]) -> str:
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]


def _validate_train(t: TrainConfig) -> None:
    """The train group's own values."""
    if not t.fanouts or any(f < 1 for f in t.fanouts):
        raise ConfigError(f"train.fanouts={list(t.fanouts)} must be one or more positive integers, e.g. train.fanouts=[10,5]")
    for key, value in (("train.epochs", t.epochs), ("train.batch_size", t.batch_size),
                       ("train.eval_batch_size", t.eval_batch_size), ("train.eval_every", t.eval_every)):
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    if t.prefetch < 0:
        raise ConfigError(f"train.prefetch={t.prefetch} must be 0 (off) or more batches")
    if t.sampler_procs < 0 or t.sampler_threads < 0:
        raise ConfigError(f"train.sampler_procs={t.sampler_procs} and train.sampler_threads={t.sampler_threads} "
                          "must be 0 or more (sampler_procs 0: sample in the rank's prefetch thread)")
    if t.sampler_procs and t.graph_on == "device":
        raise ConfigError("train.sampler_procs samples on the host, and train.graph_on=device on the GPU. HINT: "
                          "one of train.sampler_procs=0 or train.graph_on=host (or auto)")
    if t.lr <= 0:
        raise ConfigError(f"train.lr={t.lr} must be positive")
    if t.weight_decay < 0:
        raise ConfigError(f"train.weight_decay={t.weight_decay} must be 0 or more")
    if t.precision == "fp16" and t.device == "cpu":
        raise ConfigError("train.precision=fp16 needs a GPU, and train.device=cpu. HINT: train.precision=bf16 "
                          "(or auto) on CPUs")
    if t.accumulate < 1 or t.powersgd_rank < 1 or t.eval_chunk < 1:
        raise ConfigError("train.accumulate, train.powersgd_rank and train.eval_chunk must be at least 1")
    if not 0 <= t.warmup < 1:
        raise ConfigError(f"train.warmup={t.warmup} must be a fraction of the steps in [0, 1)")
    if not 0 < t.graph_on_fraction <= 1:
        raise ConfigError(f"train.graph_on_fraction={t.graph_on_fraction} must be in (0, 1]")


def _validate_run(c: RunConfig) -> None:
    """The launch, dist and metrics groups, and the sizes other groups hold."""
    for key, value in (("launch.procs", c.launch.procs), ("model.hidden_channels", c.model.hidden_channels)):
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    if c.launch.mode == "submit" and c.cluster is None:
        raise ConfigError("launch.mode=submit needs a cluster to submit to. HINT: add +cluster=NAME")
    if c.dist.timeout_s <= 0 or c.dist.init_timeout_s <= 0:
        raise ConfigError("dist.init_timeout_s and dist.timeout_s must be positive (seconds)")
    if c.metrics.every_steps < 1 or c.metrics.straggler_factor <= 1:
        raise ConfigError("metrics.every_steps must be at least 1 and metrics.straggler_factor above 1")


def _validate_checkpoint(c: CheckpointConfig) -> None:
    import signal

    if c.keep < 1 or c.every_steps < 0 or c.every_minutes < 0 or c.max_timeouts < 0:
        raise ConfigError("checkpoint.keep must be at least 1; checkpoint.every_steps, checkpoint.every_minutes "
                          "and checkpoint.max_timeouts must be 0 or more")
    if not isinstance(getattr(signal, f"SIG{c.signal}", None), signal.Signals):
        raise ConfigError(f"checkpoint.signal={c.signal!r} is not a signal name: use e.g. USR2 or USR1")


def _validate_graph_on(c: RunConfig) -> None:
    """train.graph_on=device against the rest of the run: where the graph can be sampled on the GPU."""
    from hpcgnn.checks import sampler_servers

    t = c.train
    if t.graph_on == "device":
        why = ("train.device=cpu" if t.device == "cpu" else
               "graph=partitioned (its ranks sample on the host and exchange through the CPU)"
               if c.graph.mode != "replicated" else
               f"train.sampler={t.sampler} (only sampler=neighbor runs on the GPU)" if t.sampler != "neighbor" else
               f"task={c.task.name} (only node tasks sample on the GPU)" if c.task.name != "node" else
               f"{sampler_servers(c)} sampler server(s) (they make batches on their own hosts)"
               if sampler_servers(c) else None)
        if why is not None:
            raise ConfigError(f"train.graph_on=device does not go with {why}. HINT: set train.graph_on=auto "
                              "(it samples on the GPU where it can) or host")


def _numbers(obj: Any, prefix: str) -> list[tuple[str, float]]:
    """Every float of a config (``train.lr``, ``dataset.edge_split[1]``, ...) with its key."""
    if dataclasses.is_dataclass(obj):
        return [kv for f in dataclasses.fields(obj)
                for kv in _numbers(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)]
    if isinstance(obj, dict):
        return [kv for k, v in obj.items() for kv in _numbers(v, f"{prefix}.{k}")]
    if isinstance(obj, (tuple, list)):
        return [kv for i, v in enumerate(obj) for kv in _numbers(v, f"{prefix}[{i}]")]
    if isinstance(obj, float):
        return [(prefix, obj)]
    return []


def _validate_sampler(t: TrainConfig, g: GraphConfig) -> None:
    """``train.sampler`` is one of the samplers' specs, for this graph mode, with the settings it takes."""
    spec = samplers.SPECS.get(t.sampler)
    if spec is None:
        raise ConfigError(f"train.sampler={t.sampler!r} is unknown: use one of {', '.join(samplers.SPECS)}")
    if g.mode == "partitioned" and "parts" not in spec.graphs:
        raise ConfigError(f"train.sampler={t.sampler} needs graph=replicated (partitioned graphs sample neighbours "
                          f"across parts). HINT: graph=replicated, or train.sampler="
                          f"{' or '.join(samplers.names(graph='parts'))}")
    if t.edge_budget < 0:
        raise ConfigError(f"train.edge_budget={t.edge_budget} must be 0 (batches of train.batch_size seeds) or more")
    if t.edge_budget and not spec.edge_budget:
        budgeted = [s.name for s in samplers.SPECS.values() if s.edge_budget]
        raise ConfigError(f"train.edge_budget={t.edge_budget} applies to train.sampler={' or '.join(budgeted)} (got "
                          f"train.sampler={t.sampler}). HINT: train.edge_budget=0")
    if t.clusters_per_batch < 1 or t.num_clusters < 0:
        raise ConfigError(f"train.clusters_per_batch={t.clusters_per_batch} must be at least 1 and "
                          f"train.num_clusters={t.num_clusters} 0 (derived) or more")
    if t.num_clusters and t.num_clusters < t.clusters_per_batch:
        raise ConfigError(f"train.num_clusters={t.num_clusters} is below train.clusters_per_batch="
                          f"{t.clusters_per_batch}: a step needs that many clusters. HINT: train.num_clusters=0 (derived)")
    if t.saint_coverage <= 0:
        raise ConfigError(f"train.saint_coverage={t.saint_coverage} must be positive, e.g. 20")


def _validate_graph(g: GraphConfig, world_size: int) -> None:
    if g.mode not in ("replicated", "partitioned"):
        raise ConfigError(f"graph.mode={g.mode!r} is unknown: use graph=replicated or graph=partitioned")
    if g.num_parts < 0:
        raise ConfigError(f"graph.num_parts={g.num_parts} must be 0 (one part per rank) or more")
    if g.mode == "partitioned" and g.num_parts and g.num_parts % world_size:
        raise ConfigError(f"graph.num_parts={g.num_parts} cannot be shared by {world_size} ranks: every rank owns "
                          f"the same number of parts. HINT: use a multiple of {world_size}, or graph.num_parts=0 "
                          "(one part per rank)")
    if g.cache_mb < 0:
        raise ConfigError(f"graph.cache_mb={g.cache_mb} must be 0 (no cache) or more")
    if g.warmup_batches < 1:
        raise ConfigError(f"graph.warmup_batches={g.warmup_batches} must be at least 1")
    if not 0 < g.boundary_fraction <= 1:
        raise ConfigError(f"graph.boundary_fraction={g.boundary_fraction} must be in (0, 1]; 1 keeps every "
                          "remote neighbour")
    if g.partition_mem_gb is not None and g.partition_mem_gb <= 0:
        raise ConfigError(f"graph.partition_mem_gb={g.partition_mem_gb} must be positive (or null: detect)")


def _validate_cluster(c: ClusterConfig) -> None:
    for key in ("nodes", "tasks_per_node", "cpus_per_task", "time_min"):
        if getattr(c, key) < 1:
            raise ConfigError(f"cluster.{key}={getattr(c, key)} must be at least 1")
    if c.gpus_per_node < 0:
        raise ConfigError(f"cluster.gpus_per_node={c.gpus_per_node} must be 0 or more")
    if c.gpus_per_node > 0 and c.tasks_per_node != c.gpus_per_node:
        raise ConfigError(f"cluster.tasks_per_node={c.tasks_per_node} but cluster.gpus_per_node={c.gpus_per_node}: "
                          f"hpcgnn runs one rank per GPU. HINT: set cluster.tasks_per_node={c.gpus_per_node}")
    if c.executor == "local" and c.nodes != 1:
        raise ConfigError(f"cluster.nodes={c.nodes} with cluster.executor=local: the local executor runs on "
                          "this machine only. HINT: set cluster.nodes=1")
    if c.mem_gb is not None and c.mem_gb <= 0:
        raise ConfigError(f"cluster.mem_gb={c.mem_gb} must be positive (or null for the partition default)")
    sn = c.samplers
    if sn.nodes < 0 or sn.tasks_per_node < 1 or sn.cpus_per_task < 0 or (sn.mem_gb is not None and sn.mem_gb <= 0):
        raise ConfigError("cluster.samplers: nodes must be 0 (none) or more, tasks_per_node at least 1, cpus_per_task "
                          "0 (the cluster's) or more, mem_gb positive or null")
    if sn.nodes and c.executor != "slurm":
        raise ConfigError("cluster.samplers.nodes needs cluster.executor=slurm (sampler nodes are part of a SLURM "
                          "job). HINT: without SLURM, launch.sampler_servers=N runs servers on this machine")
    # Values that land on '#SBATCH' lines: a newline there would start a new shell line.
    single_line = {k: getattr(c, k) for k in ("name", "partition", "account", "qos", "constraint", "exclude", "job_name")}
    single_line.update({f"sbatch_extra.{k}": v for k, v in c.sbatch_extra.items()})
    single_line.update({f"sbatch_extra key {k!r}": k for k in c.sbatch_extra})
    for key, value in single_line.items():
        if value is not None and any(ch in str(value) for ch in "\n\r\0"):
            raise ConfigError(f"cluster.{key}={value!r} contains a line break: sbatch options must be one line")
    for line in c.setup:
        if "\0" in line:
            raise ConfigError(f"cluster.setup line {line!r} contains a NUL byte")


# ---------------------------------------------------------------- dict -> frozen dataclasses


def frozen(tp: type, data: dict) -> Any:
    """A frozen config of class ``tp`` (``ModelConfig``, ...) from its plain data (``dataclasses.asdict``'s), fields
    it lacks at their defaults."""
    return _build(tp, data, "")


def dataset_config(**fields: Any) -> DatasetConfig:
    """The settings of dataset ``fields["name"]`` (synthetic unless named) outside a run's config (tests,
    benchmarks): its source's class, checked as a run's are (for the task it is prepared for; no run to select an
    epoch by validation)."""
    cfg = _build(DatasetConfig, fields, "dataset.")
    cfg.check(cfg.prepared_for, "last")
    return cfg


def _build(tp: Any, value: Any, where: str) -> Any:
    """Build an instance of annotation ``tp`` from plain data, tuples for lists; a group whose options have classes
    of their own (``variants``: a task's settings, a dataset source's) as the class its data's name picks; each
    field that declares its choices (``Literal``) checked against them."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        tp = _variant(tp, value, where)
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _build(hints[f.name], value[f.name], f"{where}{f.name}.")
                _check_choice(f, hints[f.name], kwargs[f.name], f"{where}{f.name}")
        return tp(**kwargs)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        return _build(next(a for a in args if a is not type(None)), value, where)
    if origin is tuple:
        return tuple(_build(args[0], v, where) for v in value)
    if origin is dict:
        return {str(k): _build(args[1], v, where) for k, v in value.items()}
    return value


def _variant(tp: type, value: dict, where: str) -> type:
    """The class of a group's chosen option, by its data's ``name`` (``tp`` itself where options share it)."""
    if not hasattr(tp, "variant"):
        return tp
    name = value.get("name", tp.name)
    cls = tp.variant(name)
    if cls is None:
        raise ConfigError(f"{where}name={name!r} is unknown: use one of {', '.join(tp.names())}")
    return cls


def _check_choice(f: dataclasses.Field, tp: Any, value: Any, key: str) -> None:
    """A field that declares its choices (``Literal``) holds one of them; one whose metadata says ``own`` may also
    name a class of the user's own (``pkg.module.Class``)."""
    allowed, own = declared(tp), f.metadata.get("own")
    if not allowed or value in allowed:
        return
    if own is None:
        raise ConfigError(f"{key}={value!r} is unknown: use {_or(tuple(map(str, allowed)))}")
    if not isinstance(value, str) or "." not in value:
        raise ConfigError(f"{key}={value!r} is unknown: use {', '.join(allowed)} or a module of your own "
                          f"({key}=pkg.module.Class, {own})")


def _schema_type(tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return Any if hasattr(tp, "variant") else schema(tp)  # (each option's class: its own schema)
    if origin is typing.Literal:
        return type(args[0])
    if origin is typing.Union:
        return Optional[_schema_type(next(a for a in args if a is not type(None)))]
    if origin is tuple:
        return typing.List[args[0]]
    return tp


@functools.cache
def schema(cls: type) -> type:
    """The mutable twin of a frozen config class, for Hydra's ConfigStore."""
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            factory = f.default_factory
            default = field(default_factory=schema(factory) if dataclasses.is_dataclass(factory) else factory)
        elif isinstance(f.default, tuple):
            default = field(default_factory=functools.partial(list, f.default))
        else:
            default = field(default=f.default)
        specs.append((f.name, _schema_type(hints[f.name]), default))
    return dataclasses.make_dataclass(cls.__name__, specs)


GROUPS: dict[str, type] = {
    "task": TaskConfig,
    "dataset": DatasetConfig,
    "model": ModelConfig,
    "graph": GraphConfig,
    "cluster": ClusterConfig,
}


def register_configs() -> None:
    """Register the schemas: ``base_config`` for conf/config.yaml, ``base_<group>`` for each group."""
    from hydra.core.config_store import ConfigStore

    from hpcgnn.env import run_name

    OmegaConf.register_new_resolver("hpcgnn_run_name", run_name, replace=True, use_cache=True)
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=schema(RunConfig))
    for group, cls in GROUPS.items():
        for suffix, option in (cls.schemas().items() if hasattr(cls, "schemas") else (("", cls),)):
            cs.store(group=group, name=f"base_{group}{suffix and '_' + suffix}", node=schema(option))


# ---------------------------------------------------------------- typo guard for overrides


def group_default(group: str) -> str | None:
    """The option conf/config.yaml's defaults choose for ``group`` (None: none)."""
    from hpcgnn import CONF_DIR

    for entry in OmegaConf.load(CONF_DIR / "config.yaml").get("defaults", []):
        if isinstance(entry, DictConfig) and group in entry:
            return entry[group]
    return None


def task_default(group: str, task: str | None) -> str | None:
    """The option a packaged task's yaml chooses for ``group`` instead of conf/config.yaml's (``task=graph``:
    ``override /dataset: synthetic_graphs``), or None."""
    from hpcgnn import CONF_DIR

    path = CONF_DIR / "task" / f"{task}.yaml"
    if not task or not path.is_file():
        return None
    for entry in OmegaConf.load(path).get("defaults", []):
        if isinstance(entry, DictConfig) and f"override /{group}" in entry:
            return entry[f"override /{group}"]
    return None


def _named(group: str, option: str | None) -> str | None:
    """The ``name`` a packaged option of ``group`` sets (``dataset=synthetic_link``: synthetic), or None."""
    from hpcgnn import CONF_DIR

    path = CONF_DIR / group / f"{option}.yaml"
    return OmegaConf.load(path).get("name") if option and path.is_file() else None


def check_override_keys(overrides: list[str]) -> None:
    """Reject command-line keys that no schema has, naming the valid ones.

    Hydra rejects them too, but without saying what would have been right;
    this runs first and costs no composition.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # malformed syntax: let Hydra report it in its own words
        return
    chosen = {ov.key_or_group: ov.value() for ov in parsed if ov.key_or_group in GROUPS and not ov.is_delete()}
    for ov in parsed:
        key = ov.key_or_group
        if key in ("hydra/launcher", "hydra/sweeper"):
            raise ConfigError(f"{key}={ov.value()}: hpcgnn submits and sweeps by itself, not through Hydra's launcher "
                              "and sweeper plugins. HINT: submit with +cluster=NAME (a cluster file: python -m hpcgnn "
                              "cluster init NAME) and sweep with -m (e.g. -m model=sage,gat +cluster=NAME), or search "
                              "with early stopping: hpcgnn tune 'train.lr=tag(log, interval(1e-4,1e-2))' (docs/tuning.md)")
        if key.startswith("hydra") or "@" in key or ov.is_delete():
            continue
        parts = key.split(".")
        if len(parts) == 1 and parts[0] in GROUPS:
            continue  # a group choice: Hydra lists the available options itself
        cls: Any = RunConfig
        option = ""  # (a group whose options have classes of their own: the one chosen)
        for depth, part in enumerate(parts):
            if depth == 1 and hasattr(cls, "variant"):
                base, option = cls, (chosen.get(parts[0]) or task_default(parts[0], chosen.get("task"))
                                     or group_default(parts[0]))
                cls = base.variant(option) or base.variant(_named(parts[0], option))
                if cls is None:
                    break  # (an option of the user's own: Hydra checks its keys against its schema)
            if not dataclasses.is_dataclass(cls):
                break
            hints = typing.get_type_hints(cls)
            if part not in hints:
                path = ".".join(parts[:depth])
                names = sorted(hints)
                close = difflib.get_close_matches(part, names, n=1)
                hint = f" Did you mean {'.'.join([*parts[:depth], close[0]])}?" if close else ""
                kwargs = ""
                if path == "model" and depth == len(parts) - 1 and not close:  # (a class's own argument: in model.kwargs)
                    kwargs = (f". HINT: an argument of your model's class goes under model.kwargs: "
                              f"+model.kwargs.{part}={ov.value()}")
                where = f"under '{path}'" if path else "at the top level"
                if option and depth == 1:
                    where += f" with {path}={option}"
                    owners = [n for n in base.names() if part in typing.get_type_hints(base.variant(n))]
                    said = " or ".join(f"{path}={n}" for n in owners[:3]) + (" or ..." if len(owners) > 3 else "")
                    kwargs = f". HINT: {key} is a setting of {said}" if owners else ""
                raise ConfigError(f"Unknown config key '{key}'.{hint} Valid keys {where}: {', '.join(names)}{kwargs}")
            tp = hints[part]
            if typing.get_origin(tp) is typing.Union:
                tp = next(a for a in typing.get_args(tp) if a is not type(None))
            cls = tp
