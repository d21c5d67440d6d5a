"""Checkpoints for an exact resume, written by all ranks together at a step boundary.

    <run_dir>/checkpoints/step-<global step>/
        common.pt      model, optimizer, LR scheduler, gradient scaler, and the trainer's
                       TrainState (epoch and step cursor, history, best epoch, counters)
        rank-<r>.pt    each rank: its RNG states (torch, CUDA, numpy, python) and its partial
                       sums of the epoch; the epoch's batches are re-made from their seeds
        MANIFEST.json  sha256 of every file, the job's fingerprint, the run that wrote it and every
                       setting (flat_config); written last
    <run_dir>/checkpoints/previous/<run id>/step-*/   other runs' checkpoints, set aside (Checkpointer)

A checkpoint is assembled in a temporary folder, every file fsync'd, and renamed into
place by rank 0 once all ranks wrote theirs: a folder named ``step-*`` is complete. At
start, every rank reads the same manifests and checksums, so all ranks pick the same
checkpoint of the same run; a corrupt or truncated newest one is skipped with a warning. Loading uses
``torch.load(weights_only=True)``: nothing but tensors and plain containers is unpickled.

Preemption: the signal handler only sets a flag (:class:`PreemptionFlag`). After every
step the ranks all-reduce ``[flag, periodic checkpoint due]``, so they agree on when to
save, and all stop together after a preemption save.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import torch

from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.env import RankEnv
from hpcgnn.errors import AnotherRankFailed, CheckpointError, first_words
from hpcgnn.io import AtomicFolder, human_bytes, no_room, save_whole, sha256_file

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: TrainState and per-rank epoch sums; batches re-made from their seeds


class Preempted(Exception):
    """Raised on every rank after the preemption checkpoint was saved: stop, then requeue."""

    def __init__(self, step: int, folder: Path):
        super().__init__(f"preempted: checkpoint of step {step} saved in {folder}")
        self.step, self.folder = step, folder


def fingerprint(cfg: RunConfig, env: RankEnv) -> dict:
    """What a checkpoint must share with the job that resumes it."""
    from hpcgnn.data import cache_folder

    return {"task": cfg.task.name, "dataset": cache_folder(cfg.dataset).name, "graph_mode": cfg.graph.mode,
            "num_parts": cfg.graph.parts_for(env.world_size) if cfg.graph.mode == "partitioned" else 0,
            "world_size": env.world_size, "model": cfg.model._target_ or cfg.model.name, "hidden_channels": cfg.model.hidden_channels,
            "fanouts": list(cfg.train.fanouts), "batch_size": cfg.train.batch_size, "seed": cfg.train.seed,
            "sampler": cfg.train.sampler, "edge_budget": cfg.train.edge_budget,
            "clusters": [cfg.train.num_clusters, cfg.train.clusters_per_batch] if cfg.train.sampler == "cluster" else []}


def _barrier() -> None:
    dist.all_reduce_sum(torch.zeros(1))


def _attempt(fn, *args) -> OSError | None:
    """``fn(*args)``; the OSError it raised, if any (the disk full, a quota: the ranks then agree to stop)."""
    try:
        fn(*args)
    except OSError as exc:
        return exc
    return None


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors in a state (dicts, lists, tuples): about what its file takes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


# Settings a resumed run may hold at other values than its checkpoint's. FREE: they touch no state the checkpoint
# holds (dataset.*: its graph is the fingerprint's; the rest: evaluation, logging, launching, performance).
# APPLIED: they change training from the resumed step on; Trainer.resume applies each for real (the optimizer's
# learning rate and weight decay are set; the rest is built from the config anyway) and the summary's
# resume_changes names them with the step. Any other setting that differs is refused: the checkpoint cannot
# honour it (the model's shape, the batches' making, the partition).
RESUME_FREE = ("run_dir", "launch.", "metrics.", "debug.", "checkpoint.", "dist.", "cluster", "dataset.",
               "train.eval_", "train.num_threads", "train.keep_freed_memory", "train.prefetch", "train.sampler_", "train.device",
               "train.graph_on", "task.hits_k", "graph.cache_", "graph.warmup_batches", "graph.partition_mem_gb",
               "model.aggregation")
RESUME_APPLIED = ("train.lr", "train.weight_decay", "train.lr_scaling", "train.lr_schedule", "train.warmup",
                  "train.epochs", "train.precision", "train.nonfinite", "train.grad_compression",
                  "train.powersgd_rank", "model.dropout")
SET_ASIDE = "previous"  # checkpoints/previous/<run id>/step-*: other runs' checkpoints, moved here, never deleted


def flat_config(cfg: RunConfig) -> dict:
    """The config as ``{"train.lr": 0.003, ...}``, JSON's types (what a manifest records and is compared with)."""
    def walk(obj, prefix: str) -> dict:
        if isinstance(obj, dict) and obj and prefix not in ("train.relation_fanouts", "cluster.sbatch_extra"):
            return {k: v for key, value in obj.items() for k, v in walk(value, f"{prefix}.{key}" if prefix else key).items()}
        return {prefix: obj}
    return json.loads(json.dumps(walk(dataclasses.asdict(cfg), "")))


def resume_changes(saved: dict, now: dict) -> tuple[list[dict], list[dict]]:
    """The settings that differ between a checkpoint's config and this job's: (applied, refused), each
    ``{"setting", "checkpoint", "now"}`` (see RESUME_FREE, RESUME_APPLIED). A setting the checkpoint has and this
    job's config has not is none of this job's: another task's or source's (a checkpoint written before each had
    its own settings held every task's), which nothing reads now."""
    applied, refused = [], []
    for key in sorted(now):
        a, b = saved.get(key), now.get(key)
        if a == b or key.startswith(RESUME_FREE):
            continue
        (applied if key in RESUME_APPLIED else refused).append({"setting": key, "checkpoint": a, "now": b})
    return applied, refused


def _manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return None


def _run_id(manifest: dict | None) -> str:
    """The run that wrote a checkpoint (one written before runs were recorded: "unrecorded")."""
    return ((manifest or {}).get("run") or {}).get("id", "unrecorded")


class Checkpointer:
    """The checkpoints of one run in ``<run_dir>/checkpoints``.

    A run is one training from its first step on, across its resumes; its identity (an id minted when it
    starts from nothing, the job that started it) is in every manifest. :meth:`start` decides, before the
    first step, which checkpoint the run continues from, if any, and moves every other run's checkpoints to
    ``checkpoints/previous/<run id>/`` (named, never deleted), so ``checkpoints/`` holds one run's and rotation
    (``checkpoint.keep``) counts and removes only them; resume never picks another run's checkpoint.

    - ``checkpoint.resume=true``: continue the newest run in the folder from its newest intact checkpoint,
      when its fingerprint and settings fit this job (else :class:`CheckpointError`, naming what differs).
    - ``checkpoint.resume=false``: start over; a SLURM job requeued after a preemption still continues the
      checkpoints that this same job wrote (same job id), and nothing else.
    """

    def __init__(self, cfg: RunConfig, env: RankEnv):
        self.cfg, self.env = cfg, env
        self.folder = Path(cfg.run_dir) / "checkpoints"
        self.fingerprint = fingerprint(cfg, env)
        self.config = flat_config(cfg)
        self.run: dict | None = None  # this run's identity: {"id", "job_id", "started"} (start() decides)
        self.changes: list[dict] = []  # settings changed since the checkpoint resumed from, to apply
        self._last = time.monotonic()
        self._loaded: tuple | None = None  # (folder, common, this rank's) read while picking the checkpoint

    # ----------------------------------------------------------- when

    def periodic_due(self, global_step: int) -> bool:
        c = self.cfg.checkpoint
        if c.every_steps and global_step % c.every_steps == 0:
            return True
        return bool(c.every_minutes) and time.monotonic() - self._last >= 60 * c.every_minutes

    # ----------------------------------------------------------- which run

    def start(self) -> Path | None:
        """Collective, before the first step: the checkpoint this run continues from (None: a new run, with a
        new id), the same on every rank; other runs' checkpoints are then moved aside (rank 0)."""
        folder, manifest = self._pick()
        _barrier()  # every rank has read the folder before rank 0 moves anything
        if folder is not None:
            self.run = manifest.get("run") or {"id": "unrecorded", "job_id": "", "started": manifest.get("time", 0.0)}
        else:
            new = {"id": uuid.uuid4().hex[:12], "job_id": self.env.job_id, "started": time.time()}
            self.run = dist.all_gather_object(new)[0]  # rank 0's
        if self.env.is_main:
            self._set_aside_others()
        _barrier()
        return folder

    def _pick(self) -> tuple[Path | None, dict]:
        """The newest intact checkpoint of the newest run this job may continue (see the class) and its manifest,
        or (None, {}); every manifest is read once."""
        runs: dict[str, list[tuple[Path, dict | None]]] = {}
        for folder in sorted(self.folder.glob("step-*")):
            manifest = _manifest(folder)
            runs.setdefault(_run_id(manifest), []).append((folder, manifest))
        if not self.cfg.checkpoint.resume:  # only a requeued job's own
            mine = self.env.job_id if self.env.source in ("slurm", "submitit_local") else ""
            runs = {r: c for r, c in runs.items() if mine and all(((m or {}).get("run") or {}).get("job_id") == mine
                                                                  for _, m in c if m is not None)}
        newest = sorted(runs.values(), key=lambda c: max((m or {}).get("time", 0.0) for _, m in c), reverse=True)
        for candidates in newest:
            for folder, manifest in reversed(candidates):  # newest step first
                problem = self._verify(folder, manifest)
                if problem is None:
                    self._check_fits(folder, manifest)
                    problem = self._read_ahead(folder)
                if problem is None:
                    return folder, manifest
                if self.env.is_main:  # (one line, rank 0's: every rank skips the same one)
                    print(f"hpcgnn: WARNING: checkpoint {folder} skipped: {problem}; trying the previous one",
                          flush=True)
                else:
                    log.debug("checkpoint %s skipped: %s", folder, problem)
        return None, {}

    def _set_aside_others(self) -> None:
        """Move every checkpoint of another run to ``previous/<run id>/``, saying where."""
        moved: dict[str, list[str]] = {}
        for folder in sorted(self.folder.glob("step-*")):
            run = _run_id(_manifest(folder))
            if run != self.run["id"]:
                self._set_aside(folder, run)
                moved.setdefault(run, []).append(folder.name)
        for run, names in moved.items():
            why = "checkpoint.resume=false" if not self.cfg.checkpoint.resume else "a new run starts here"
            print(f"hpcgnn: {why}: {len(names)} checkpoint(s) of run {run} ({', '.join(names)}) moved to "
                  f"{self.folder / SET_ASIDE / run}", flush=True)

    def _set_aside(self, folder: Path, run: str) -> None:
        target = self.folder / SET_ASIDE / run / folder.name
        target.parent.mkdir(parents=True, exist_ok=True)
        n = 1
        while target.exists():  # (the same step set aside twice: keep both)
            target, n = target.with_name(f"{folder.name}.{n}"), n + 1
        os.rename(folder, target)

    # ----------------------------------------------------------- save

    def save(self, global_step: int, common: dict, rank_state: dict) -> Path:
        """Collective: every rank writes its file; rank 0 the common state, the manifest, the rename."""
        if self.run is None:
            raise RuntimeError("Checkpointer.save before start(): the run's identity is not decided")
        folder = AtomicFolder(self.folder / f"step-{global_step:09d}", replace=True,
                              tmp_name=f".step-{global_step:09d}.tmp")
        need = _tensor_bytes(rank_state) + (_tensor_bytes(common) if self.env.is_main else 0)
        self._agree(global_step, folder, need, _attempt(folder.create) if self.env.is_main else None)
        failed = _attempt(save_whole, folder.tmp / f"rank-{self.env.rank}.pt", rank_state)
        if self.env.is_main and failed is None:
            failed = _attempt(save_whole, folder.tmp / "common.pt", {"format_version": FORMAT_VERSION, **common})
        self._agree(global_step, folder, need, failed)  # every rank's file is on disk
        if self.env.is_main:
            failed = _attempt(self._commit, global_step, folder)
        self._agree(global_step, folder, need, failed if self.env.is_main else None)
        # (nobody moves on, or exits, before the checkpoint is in place)
        self._last = time.monotonic()
        return folder.final

    def _commit(self, global_step: int, folder: AtomicFolder) -> None:
        """Rank 0, once every file is written: the manifest, the rename into place, old checkpoints pruned."""
        files = sorted(p.name for p in folder.tmp.iterdir() if p.suffix == ".pt")
        manifest = {"format_version": FORMAT_VERSION, "step": global_step, "time": time.time(), "run": self.run,
                    "fingerprint": self.fingerprint, "config": self.config,
                    "files": {n: sha256_file(folder.tmp / n) for n in files}}
        with open(folder.tmp / "MANIFEST.json", "w") as f:
            json.dump(manifest, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        other = _run_id(_manifest(folder.final)) if folder.final.exists() else self.run["id"]
        if other != self.run["id"]:  # another run wrote into this folder meanwhile: keep its checkpoint
            self._set_aside(folder.final, other)
        folder.commit()
        self._prune()

    def _agree(self, step: int, folder: AtomicFolder, need: int, failed: OSError | None) -> None:
        """Collective, at each stage of a save: whether a rank failed to write. If one did, the temporary folder
        goes (the checkpoints before it stay whole) and every rank raises: a full disk or quota as a
        :class:`~hpcgnn.errors.CheckpointError` naming the folder, the bytes needed and free; anything else as
        it is (the other ranks as echoes of it)."""
        flags = dist.all_reduce_max(torch.tensor([int(failed is not None), int(no_room(failed))]))
        if not int(flags[0]):
            return
        total = int(dist.all_reduce_sum(torch.tensor([need], dtype=torch.float64)).item())
        if self.env.is_main:
            folder.discard()
        _barrier()
        if failed is not None and not no_room(failed):
            raise failed
        if not int(flags[1]):
            raise AnotherRankFailed(f"another rank could not write its part of the checkpoint of step {step}")
        mine = sorted(self.folder.glob("step-*"))
        intact = f"the checkpoint {mine[-1]} is intact" if mine else "no earlier checkpoint of this run exists"
        if mine:  # (what the last one took on disk: the best estimate, its files' framing included)
            total = max(total, sum(f.stat().st_size for f in mine[-1].iterdir() if f.is_file()))
        free = shutil.disk_usage(self.folder).free
        why = "the disk is full, or your quota" if free < total else "the disk has room: your quota is likely full"
        raise CheckpointError(f"the checkpoint of step {step} does not fit in {self.folder}: it needs about "
                              f"{human_bytes(total)} and {human_bytes(free)} are free there ({why}); {intact}. "
                              "HINT: free space there, or move the run to a file system with room "
                              "(the same command with another hydra.run.dir starts anew; this one resumes from the "
                              "intact checkpoint once there is room)")

    def _prune(self) -> None:
        """Keep this run's newest ``checkpoint.keep`` checkpoints; another run's are never touched."""
        mine = [f for f in sorted(self.folder.glob("step-*")) if _run_id(_manifest(f)) == self.run["id"]]
        for old in mine[: max(0, len(mine) - self.cfg.checkpoint.keep)]:
            shutil.rmtree(old, ignore_errors=True)

    # ----------------------------------------------------------- load

    def _verify(self, folder: Path, manifest: dict | None = None) -> str | None:
        """None if the checkpoint is complete and intact; else what is wrong (``manifest``: read already)."""
        manifest = manifest if manifest is not None else _manifest(folder)
        if manifest is None:
            return "MANIFEST.json is missing or unreadable"
        expected = {"common.pt", *(f"rank-{r}.pt" for r in range(self.env.world_size))}
        if manifest.get("fingerprint", {}).get("world_size") == self.env.world_size and \
                set(manifest.get("files", {})) != expected:
            return f"files {sorted(manifest.get('files', {}))} instead of {sorted(expected)}"
        for name, digest in manifest.get("files", {}).items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if sha256_file(path) != digest:
                return f"{name} is corrupt or truncated (sha256 differs from MANIFEST.json)"
        return None

    def _check_fits(self, folder: Path, manifest: dict) -> None:
        """The checkpoint can continue this job: same format, fingerprint and settings, but for those a resume
        may change (they are kept in ``changes``, to apply). Raises CheckpointError naming what differs."""
        start_over = (f"HINT: to start over instead, use a new output folder (hydra.run.dir=...) or "
                      f"checkpoint.resume=false (the checkpoints there are moved to {self.folder / SET_ASIDE}/)")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"the checkpoint {folder} has format {manifest.get('format_version')}, this hpcgnn "
                                  f"resumes format {FORMAT_VERSION}. {start_over}")
        theirs = manifest["fingerprint"]
        diff = {k: (theirs.get(k), v) for k, v in self.fingerprint.items() if theirs.get(k) != v}
        if diff:
            listing = ", ".join(f"{k}: checkpoint {a!r}, job {b!r}" for k, (a, b) in diff.items())
            raise CheckpointError(f"the checkpoint {folder} belongs to another job ({listing}). {start_over}")
        if "config" not in manifest:
            log.warning("checkpoint %s records no settings (written by an older hpcgnn): settings changed since are "
                        "not checked", folder)
            return
        self.changes, refused = resume_changes(manifest["config"], self.config)
        if refused:
            listing = "; ".join(f"{c['setting']}: checkpoint {c['checkpoint']!r}, now {c['now']!r}" for c in refused)
            raise CheckpointError(f"the checkpoint {folder} was written with settings a resumed run cannot change "
                                  f"({listing}). HINT: set them back to resume; {start_over.removeprefix('HINT: ')}")

    def _read_ahead(self, folder: Path) -> str | None:
        """Collective: load the checkpoint's common state and this rank's now (kept for :meth:`load`); None when
        every rank could, else why not. A file its manifest vouches for may still not load: written by another
        version, or holding what ``weights_only`` refuses (a pickle of code, a manifest made to match)."""
        why = None
        try:
            self._loaded = (folder, *self._read(folder))
        except Exception as exc:  # (torch's unpickling errors are of many kinds; any means: not this one)
            why = f"it cannot be loaded ({type(exc).__name__}: {first_words(str(exc))})"
        if int(dist.all_reduce_max(torch.tensor([0 if why is None else 1])).item()) and why is None:
            why = "another rank's part of it cannot be loaded"
        return why

    def _read(self, folder: Path) -> tuple[dict, dict]:
        common = torch.load(folder / "common.pt", map_location="cpu", weights_only=True)
        mine = torch.load(folder / f"rank-{self.env.rank}.pt", map_location="cpu", weights_only=True)
        return common, mine

    def load(self, folder: Path) -> tuple[dict, dict]:
        loaded = self._loaded
        if loaded is not None and loaded[0] == folder:
            self._loaded = None
            return loaded[1], loaded[2]
        return self._read(folder)


_early: set[int] = set()  # preemption signals that arrived before a PreemptionFlag watched for them


def catch_early(signame: str) -> None:
    """Until training watches for it (:class:`PreemptionFlag`), the preemption signal is noted, not fatal: the rank
    then checkpoints at its first step (a local run's launcher passes the signal on whenever it comes)."""
    signal.signal(getattr(signal, f"SIG{signame}"), lambda signum, frame: _early.add(signum))


class PreemptionFlag:
    """Replaces the handler of ``signame`` with one that only records the signal.

    The handler it replaced (submitit's requeue handler, under submitit) is kept in
    ``previous`` and called after the checkpoint, outside any signal context.
    """

    def __init__(self, signame: str):
        self.signum = getattr(signal, f"SIG{signame}")
        self.raised = self.signum in _early  # (it came before training began: see catch_early)
        _early.discard(self.signum)
        self.previous = signal.signal(self.signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def restore(self) -> None:
        signal.signal(self.signum, self.previous if self.previous is not None else signal.SIG_DFL)
