"""Checkpoints for an exact resume, written by all ranks together at a step boundary.

    <run_dir>/checkpoints/step-<global step>/
        common.pt      model, optimizer, LR scheduler, gradient scaler, and the trainer's
                       TrainState (epoch and step cursor, history, best epoch, counters)
        rank-<r>.pt    each rank: its RNG states (torch, CUDA, numpy, python) and its partial
                       sums of the epoch; the epoch's batches are re-made from their seeds
        MANIFEST.json  sha256 of every file and the job's fingerprint; written last

A checkpoint is assembled in a temporary folder, every file fsync'd, and renamed into
place by rank 0 once all ranks wrote theirs: a folder named ``step-*`` is complete. On
load, every rank checks the same manifest and checksums, so all ranks pick the same
checkpoint; a corrupt or truncated newest one is skipped with a warning. Loading uses
``torch.load(weights_only=True)``: nothing but tensors and plain containers is unpickled.

Preemption: the signal handler only sets a flag (:class:`PreemptionFlag`). After every
step the ranks all-reduce ``[flag, periodic checkpoint due]``, so they agree on when to
save, and all stop together after a preemption save.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import time
from pathlib import Path

import torch

from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.env import RankEnv
from hpcgnn.errors import CheckpointError
from hpcgnn.io import AtomicFolder, atomic_open, sha256_file

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
            "num_parts": (cfg.graph.num_parts or env.world_size) if cfg.graph.mode == "partitioned" else 0,
            "world_size": env.world_size, "model": cfg.model.name, "hidden_channels": cfg.model.hidden_channels,
            "fanouts": list(cfg.train.fanouts), "batch_size": cfg.train.batch_size, "seed": cfg.train.seed,
            "sampler": cfg.train.sampler, "edge_budget": cfg.train.edge_budget,
            "clusters": [cfg.train.num_clusters, cfg.train.clusters_per_batch] if cfg.train.sampler == "cluster" else []}


def _write(path: Path, obj) -> None:
    """torch.save, fsync'd, under a temporary name first."""
    with atomic_open(path, "wb") as f:
        torch.save(obj, f)


def _barrier() -> None:
    dist.all_reduce_sum(torch.zeros(1))


class Checkpointer:
    def __init__(self, cfg: RunConfig, env: RankEnv):
        self.cfg, self.env = cfg, env
        self.folder = Path(cfg.run_dir) / "checkpoints"
        self.fingerprint = fingerprint(cfg, env)
        self._last = time.monotonic()

    # ----------------------------------------------------------- when

    def periodic_due(self, global_step: int) -> bool:
        c = self.cfg.checkpoint
        if c.every_steps and global_step % c.every_steps == 0:
            return True
        return bool(c.every_minutes) and time.monotonic() - self._last >= 60 * c.every_minutes

    # ----------------------------------------------------------- save

    def save(self, global_step: int, common: dict, rank_state: dict) -> Path:
        """Collective: every rank writes its file; rank 0 the common state, the manifest, the rename."""
        folder = AtomicFolder(self.folder / f"step-{global_step:09d}", replace=True,
                              tmp_name=f".step-{global_step:09d}.tmp")
        if self.env.is_main:
            folder.create()
        _barrier()
        _write(folder.tmp / f"rank-{self.env.rank}.pt", rank_state)
        if self.env.is_main:
            _write(folder.tmp / "common.pt", {"format_version": FORMAT_VERSION, **common})
        _barrier()  # every rank's file is on disk
        if self.env.is_main:
            files = sorted(p.name for p in folder.tmp.iterdir() if p.suffix == ".pt")
            manifest = {"format_version": FORMAT_VERSION, "step": global_step, "time": time.time(),
                        "fingerprint": self.fingerprint, "files": {n: sha256_file(folder.tmp / n) for n in files}}
            with open(folder.tmp / "MANIFEST.json", "w") as f:
                json.dump(manifest, f, indent=2)
            folder.commit()
            self._prune()
        _barrier()  # nobody moves on (or exits) before the checkpoint is in place
        self._last = time.monotonic()
        return folder.final

    def _prune(self) -> None:
        steps = sorted(self.folder.glob("step-*"))
        for old in steps[: max(0, len(steps) - self.cfg.checkpoint.keep)]:
            shutil.rmtree(old, ignore_errors=True)

    # ----------------------------------------------------------- load

    def _verify(self, folder: Path) -> str | None:
        """None if the checkpoint is complete and intact; else what is wrong."""
        try:
            manifest = json.loads((folder / "MANIFEST.json").read_text())
        except (OSError, ValueError) as exc:
            return f"unreadable MANIFEST.json ({exc})"
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

    def _check_fingerprint(self, folder: Path) -> None:
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"the checkpoint {folder} has format {manifest.get('format_version')}, this hpcgnn "
                                  f"resumes format {FORMAT_VERSION}. HINT: use a new output folder (hydra.run.dir=...), "
                                  "or checkpoint.resume=false to start over")
        theirs = manifest["fingerprint"]
        diff = {k: (theirs.get(k), v) for k, v in self.fingerprint.items() if theirs.get(k) != v}
        if diff:
            listing = ", ".join(f"{k}: checkpoint {a!r}, job {b!r}" for k, (a, b) in diff.items())
            raise CheckpointError(f"the checkpoint {folder} belongs to another job ({listing}). HINT: use a new "
                                  "output folder (hydra.run.dir=...), or checkpoint.resume=false to start over")

    def latest(self) -> Path | None:
        """The newest intact checkpoint of this run (same on every rank), or None."""
        if not self.cfg.checkpoint.resume:
            return None
        for folder in sorted(self.folder.glob("step-*"), reverse=True):
            problem = self._verify(folder)
            if problem is None:
                self._check_fingerprint(folder)
                return folder
            log.warning("checkpoint %s skipped: %s; trying the previous one", folder, problem)
            if self.env.is_main:
                print(f"hpcgnn: WARNING: checkpoint {folder} skipped: {problem}", flush=True)
        return None

    def load(self, folder: Path) -> tuple[dict, dict]:
        common = torch.load(folder / "common.pt", map_location="cpu", weights_only=True)
        mine = torch.load(folder / f"rank-{self.env.rank}.pt", map_location="cpu", weights_only=True)
        return common, mine


class PreemptionFlag:
    """Replaces the handler of ``signame`` with one that only records the signal.

    The handler it replaced (submitit's requeue handler, under submitit) is kept in
    ``previous`` and called after the checkpoint, outside any signal context.
    """

    def __init__(self, signame: str):
        self.signum = getattr(signal, f"SIG{signame}")
        self.raised = False
        self.previous = signal.signal(self.signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def restore(self) -> None:
        signal.signal(self.signum, self.previous if self.previous is not None else signal.SIG_DFL)
