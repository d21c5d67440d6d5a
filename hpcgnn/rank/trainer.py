"""The training loop over components: store, task, model, optimizer, checkpointer, metrics.

    store = open_store(...)       # the graph this rank holds, and the loaders it hands out
    task = build_task(...)        # targets, loss, metrics, evaluation (node classification, ...)
    model, optimizer, schedule    # DDP-wrapped when there are several ranks
    state = TrainState()          # everything checkpointed besides the tensors above

A batch is born in the store's loader (``sampling/loader.py``), travels through the
prefetch thread and :meth:`Trainer.train_step` into the task's ``step`` (the model's
forward and the loss), and dies in the backward pass. Saving and resuming each touch one
place: :meth:`Trainer.common_state` / :meth:`Trainer.load_common_state` and their per-rank
twins. The hot path does not wait for the device: losses and counts stay on it, and
timings are read on logging steps only (``metrics.every_steps``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import hpcgnn.sampling.producers as producers
from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.env import RankEnv
from hpcgnn.errors import DatasetError
from hpcgnn.io import write_json
from hpcgnn.rank.checkpoint import Checkpointer, Preempted, PreemptionFlag
from hpcgnn.rank.faults import Faults
from hpcgnn.rank.kept import KeptModels
from hpcgnn.rank.metrics import StepMetrics
from hpcgnn.rank.nonfinite import NonFiniteGuard
from hpcgnn.rank.pruning import TrialReports
from hpcgnn.rank.summary import log_start, progress, progress_bar, run_summary
from hpcgnn.rank.techniques import (
    CommHook,
    autocast,
    effective_lr,
    grad_scaler,
    make_scheduler,
    resolve_precision,
    step_weights,
)
from hpcgnn.rank.trackers import Trackers
from hpcgnn.rng import rng_state, set_rng_state
from hpcgnn.specs.datasets import empty_validation
from hpcgnn.tasks import build_task, open_store

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """What the run has done, checkpointed with the model (plain numbers and containers)."""

    epoch: int = 1  # the epoch running (or next to run)
    step_in_epoch: int = 0  # micro-batches of it done
    step: int = 0  # micro-batches done in the whole run
    resumes: int = 0  # times this run continued from a checkpoint
    train_time_s: float = 0.0  # training seconds of the finished epochs (the slowest rank's)
    seeds_done: int = 0  # targets trained on in the finished epochs, all ranks
    best_epoch: int = 0  # epoch of the best validation metric (0: none yet)
    best: dict[str, float] = field(default_factory=dict)  # that epoch's evaluation row
    history: list[dict] = field(default_factory=list)  # one row per finished epoch
    nonfinite_skipped: int = 0  # optimizer steps skipped for NaN/inf gradients (train.nonfinite=skip)
    resume_changes: list[dict] = field(default_factory=list)  # settings changed on a resume: what, from, to, at which step

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        fresh = TrainState()  # (fields added since a checkpoint was written keep their defaults)
        for f in dataclasses.fields(self):
            setattr(self, f.name, state.get(f.name, getattr(fresh, f.name)))


class EpochSums:
    """This rank's running sums of an epoch; the loss and hit sums stay on the device until it ends."""

    def __init__(self, device: torch.device):
        # loss x targets, targets predicted right, targets whose batch's loss was finite (the loss's denominator)
        self.values = torch.zeros(3, dtype=torch.float64, device=device)
        self.count = 0  # targets (the accuracy's denominator)
        self.seeds = 0  # what the steps trained on (seed nodes, positive edges): throughput
        self.steps = 0
        self.time_s = 0.0  # training time of the epoch before this (re)start

    def add(self, out, finite: torch.Tensor) -> None:
        """One micro-batch's StepResult, and whether its loss is finite (a bad batch's loss is left out: it can
        only be there under train.nonfinite=skip)."""
        loss = torch.where(finite, out.loss.detach().double(), 0.0)
        self.values += torch.stack([loss * out.count, out.correct.double(), finite.double() * out.count])
        self.count += out.count
        self.seeds += out.count if out.seeds is None else out.seeds
        self.steps += 1

    def totals(self) -> list[float]:
        """[loss x targets, correct, targets with a finite loss, targets, seeds] summed over ranks (collective)."""
        host = torch.tensor([float(self.count), float(self.seeds)], dtype=torch.float64)
        return dist.all_reduce_sum(torch.cat([self.values.cpu(), host])).tolist()

    def state_dict(self, elapsed_s: float) -> dict:
        return {"values": self.values.cpu(), "count": self.count, "seeds": self.seeds, "steps": self.steps,
                "time_s": elapsed_s}

    def load_state_dict(self, state: dict) -> None:
        values = state["values"]
        if values.numel() == 2:  # written before the finite targets were counted: all of them were
            values = torch.cat([values, torch.tensor([float(state["count"])], dtype=values.dtype)])
        self.values.copy_(values)
        self.count, self.seeds, self.steps, self.time_s = state["count"], state["seeds"], state["steps"], state["time_s"]


class Trainer:
    """One rank's training run. ``train()`` returns the run summary (the same on every rank)."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device):
        precision, why = resolve_precision(cfg.train.precision, device)
        if cfg.train.precision == "auto":  # decided once; every component reads the decision
            log.info("train.precision=auto: %s (%s)", precision, why)
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))
        t = cfg.train
        self.cfg, self.env, self.device = cfg, env, device
        self.t_start = time.perf_counter()
        self.store = open_store(cfg, env, device)
        self.task = build_task(cfg, env, self.store, device)
        # a tune's trial: each evaluated epoch reported to the study, the pruner's word heard (inert otherwise)
        self.trial = TrialReports(cfg, env, f"val_{self.task.metric}" if cfg.tune.metric == "auto" else cfg.tune.metric)
        self.pruned_at = 0  # the epoch after which the pruner stopped this trial (0: it was not)
        self.trackers = Trackers(cfg, env.is_main)  # W&B, MLflow (metrics.trackers): rank 0's, or none
        # what makes the training batches (the rank, its sampler processes, its servers): started by train(), closed
        # at its end; the model's batch transform is given here, once
        self.source = producers.choose(producers.ProducerSettings.of(cfg, env), self.store.graph_side(),
                                       self.task.transform, device)
        torch.manual_seed(t.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
        self.model = self.task.build_model().to(device)
        self.lr = effective_lr(t.lr, t.lr_scaling, env.world_size, t.accumulate)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr, weight_decay=t.weight_decay)
        self.opt_steps = math.ceil(self.store.steps / t.accumulate)  # optimizer steps per epoch
        self.scheduler = make_scheduler(self.optimizer, t.lr_schedule, self.opt_steps * t.epochs, t.warmup)
        self.scaler = grad_scaler(t.precision, device)
        self.checkpointer = Checkpointer(cfg, env)
        self.kept = KeptModels(cfg, self.store.shape, self.checkpointer, env.is_main)  # model/best.pt, last.pt
        m = cfg.metrics
        self.metrics = StepMetrics(cfg.run_dir, env.rank, device, m.every_steps, m.straggler_factor, m.tensorboard)
        self.state = TrainState()
        self.sums = EpochSums(device)
        self.hook = CommHook(t.grad_compression, t.powersgd_rank)
        self.guard = NonFiniteGuard(t.nonfinite, device, watch_grads=t.precision != "fp16")
        self.faults = Faults(cfg.debug, env.rank, cfg.checkpoint.signal)
        self.allreduce_bytes: list[int] = []
        self.ddp: torch.nn.Module = self.model
        self.first_step_done = False

    # ------------------------------------------------------------------ state: saving and resuming

    def common_state(self) -> dict:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "state": self.state.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        state.update(self.kept.state_dict())  # (rank 0's, who writes this part)
        return state

    def load_common_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.state.load_state_dict(state["state"])
        self.kept.load_state_dict(self.model, state, self.state.best_epoch, self.state.step, self.state.best)

    def rank_state(self, elapsed_s: float) -> dict:
        return {"rng": rng_state(), "sums": self.sums.state_dict(elapsed_s)}

    def load_rank_state(self, state: dict) -> None:
        set_rng_state(state["rng"])
        if self.state.step_in_epoch > 0:  # resuming mid-epoch: its partial sums come back too
            self.sums.load_state_dict(state["sums"])

    def resume(self) -> None:
        """Continue from the newest intact checkpoint of this run, if any (the same on every rank), with the
        settings a resume may change applied from here on (checkpoint.RESUME_APPLIED) and recorded."""
        folder = self.checkpointer.start()
        if folder is None:
            return
        common, mine = self.checkpointer.load(folder)
        self.load_common_state(common)
        self.load_rank_state(mine)
        self.state.resumes += 1
        s = self.state
        log.info("resumed from %s: epoch %d, step %d of %d (resume %d)", folder, s.epoch, s.step_in_epoch,
                 self.store.steps, s.resumes)
        changes = self.checkpointer.changes
        if changes:
            self._apply_optimizer_settings()
            s.resume_changes += [{**c, "from_step": s.step + 1} for c in changes]
            log.info("settings changed since the checkpoint, applied from step %d: %s", s.step + 1,
                     ", ".join(f"{c['setting']} {c['checkpoint']} -> {c['now']}" for c in changes))

    def _apply_optimizer_settings(self) -> None:
        """The optimizer's state came from the checkpoint: give it this run's learning rate (train.lr, its
        scaling) and weight decay, at the schedule's current point (the other settings a resume may change
        are built from the config)."""
        sched = self.scheduler
        sched.base_lrs = [self.lr for _ in sched.base_lrs]
        for group, factor in zip(self.optimizer.param_groups, sched.lr_lambdas, strict=True):
            group["initial_lr"] = self.lr
            group["lr"] = self.lr * factor(sched.last_epoch)
            group["weight_decay"] = self.cfg.train.weight_decay
        sched._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    # ------------------------------------------------------------------ the loop

    def train(self) -> dict:
        self.check_splits()
        self.resume()
        if self.env.world_size > 1:
            self.ddp = DistributedDataParallel(self.model,
                                               device_ids=[self.device] if self.device.type == "cuda" else None,
                                               find_unused_parameters=getattr(self.model, "unused_parameters", False))
            self.ddp.register_comm_hook(self.hook.state, self.hook.hook)
        log_start(self)
        self.trackers.start()
        preempt = PreemptionFlag(self.cfg.checkpoint.signal)
        try:
            self.source.start()  # (sampler processes, servers: before the clock)
            for epoch in range(self.state.epoch, self.cfg.train.epochs + 1):
                row = self.run_epoch(epoch, preempt)
                if epoch % self.cfg.train.eval_every == 0 or epoch == self.cfg.train.epochs:
                    t0 = time.perf_counter()
                    row.update(self.evaluate())
                    row["eval_s"] = time.perf_counter() - t0  # (exact inference's, with eval_mode=full)
                self.end_epoch(epoch, row)
                if self.trial.after_epoch(epoch, row):  # a hopeless trial of a tune: stopped here, every rank
                    self.pruned_at = epoch
                    break
            self.source.close(done=True)  # sampler servers, if any, may leave
            last = self.state.history[-1] if self.state.history else {}
            self.kept.last(self.model, self.pruned_at or self.cfg.train.epochs, self.state.step,
                           {k: v for k, v in last.items() if k.startswith(("val_", "test_"))})
        except BaseException as exc:
            self.trackers.close(preempted=isinstance(exc, Preempted))
            raise
        finally:
            preempt.restore()
            self.metrics.close()
            self.source.close()  # its sampler processes, if any
            # Free DDP's reducer now, on this thread, while the process group lives. Kept alive by an
            # exception's traceback instead, it would be freed at interpreter exit, where gloo's
            # destructor joins a worker thread that waits for the GIL: a hang at exit.
            self.ddp = self.model
        summary = run_summary(self)
        self.trackers.finish(summary)
        return summary

    def run_epoch(self, epoch: int, preempt: PreemptionFlag) -> dict:
        """One epoch of this rank's steps (from the resumed step on); returns the epoch's training row."""
        t, s, steps = self.cfg.train, self.state, self.store.steps
        self.model.train()
        if s.step_in_epoch == 0:
            self.sums = EpochSums(self.device)
        skipped = s.nonfinite_skipped
        loader = self.source.epoch(self.store.train_plan(epoch, s.step_in_epoch))
        weights = step_weights(dist.all_gather_object(loader.sizes), self.env.rank, t.accumulate)
        before = self.store.counters()
        t0 = time.perf_counter()
        # Closed on any exit, so the prefetch thread is joined before an exception leaves the loop.
        batches = iter(loader)
        if progress_bar(self.cfg, self.env):
            batches = tqdm(batches, total=steps, initial=s.step_in_epoch, desc=f"epoch {epoch}/{t.epochs}",
                           leave=False, dynamic_ncols=True)
        with contextlib.closing(batches):
            t_ready = time.perf_counter()
            for batch in batches:
                self.faults.before_step(s.step + 1)  # (debug.*: none by default)
                wait_s = time.perf_counter() - t_ready
                i = s.step_in_epoch
                last = (i + 1) % t.accumulate == 0 or i + 1 == steps  # the micro-batch that ends a step
                self.train_step(batch, epoch, weights[i], last, wait_s)
                if last:  # checkpoints fall between optimizer steps, never inside one
                    # the device's NaN/inf notes are read where the host waits anyway (see hpcgnn.rank.nonfinite)
                    fresh = self.device.type != "cuda" or s.step % self.cfg.metrics.every_steps == 0 or i + 1 == steps
                    self._after_optimizer_step(epoch, self.sums.time_s + time.perf_counter() - t0, preempt, fresh)
                t_ready = time.perf_counter()
        if self.sums.steps != steps:  # an invariant of the seed schedule; a mismatch would hang DDP next epoch
            raise RuntimeError(f"rank {self.env.rank} ran {self.sums.steps} steps, expected {steps}")
        elapsed = dist.all_reduce_max(torch.tensor([self.sums.time_s + time.perf_counter() - t0]))
        loss_sum, correct, finite, count, seeds = self.sums.totals()
        comm = self.store.comm(before)
        epoch_metrics = self.metrics.end_epoch(epoch, socket.gethostname())
        s.train_time_s += elapsed.item()
        s.seeds_done += int(seeds)
        ranks = epoch_metrics["ranks"]
        # each phase's seconds this epoch, the ranks' mean (for the trackers; epochs.jsonl keeps every rank's)
        self.epoch_phases = {k: sum(r["phases"][k] for r in ranks) / len(ranks) for k in ranks[0]["phases"]}
        if s.nonfinite_skipped > skipped:
            log.warning("epoch %d: %d optimizer step(s) skipped for NaN/inf gradients (train.nonfinite=skip)", epoch,
                        s.nonfinite_skipped - skipped)
        train = {f"train_{self.task.train_metric}": correct / max(count, 1)} if self.task.train_metric else {}
        return {"epoch": epoch, "loss": loss_sum / finite if finite else math.nan, **train,
                "seeds_per_s": seeds / elapsed.item(), "edges_per_s": sum(r["edges"] for r in ranks) / elapsed.item(),
                "epoch_s": elapsed.item(), "lr": self.scheduler.get_last_lr()[0], "balance": epoch_metrics["balance"],
                "peak_mem_mb": max(r["peak_mem_mb"] for r in ranks),
                "host_peak_mb": max(r["host_peak_mb"] for r in ranks), **comm,
                **({"nonfinite_skipped": s.nonfinite_skipped - skipped} if t.nonfinite == "skip" else {})}

    def train_step(self, batch, epoch: int, weight: float, last: bool, wait_s: float) -> None:
        """Forward and backward of one micro-batch, its loss weighted by its share of the step's targets;
        the optimizer step when ``last``. Under DDP, ``no_sync`` holds the all-reduce back until the
        last micro-batch of an accumulated step (DDP decides at forward time: it covers both)."""
        t, s, clock = self.cfg.train, self.state, self.metrics.clock
        no_sync = getattr(self.ddp, "no_sync", None)
        with no_sync() if (no_sync is not None and not last) else contextlib.nullcontext():
            m0 = clock.mark()
            with autocast(t.precision, self.device):
                out = self.task.step(self.ddp, batch)
            out = self.faults.after_forward(s.step + 1, out)
            finite = self.guard.loss(s.step + 1, out.loss)
            m1 = clock.mark()
            scaled = out.loss * weight
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            m2 = clock.mark()
        if last:
            apply = self.guard.gradients_ok(s.step + 1, self.model.parameters())
            s.nonfinite_skipped += not apply
            optimizer_step(self.optimizer, self.scheduler, self.scaler, apply)
        m3 = clock.mark()
        allreduce_s, sent = self.hook.take()
        if last and self.env.world_size > 1:
            self.allreduce_bytes.append(sent)
        self.sums.add(out, finite)
        s.step += 1
        s.step_in_epoch += 1
        host = {"wait_s": wait_s, "allreduce_s": allreduce_s}
        marks = {"sample_s": batch.sample, "gather_s": batch.gather, "h2d_s": batch.h2d, "forward_s": (m0, m1),
                 "backward_s": (m1, m2), "optimizer_s": (m2, m3)}
        self.metrics.record(s.step, epoch, host, marks, batch, out.loss)
        if not self.first_step_done:  # from now on a stuck collective means a stuck rank: fail fast
            self.first_step_done = True
            dist.shorten_timeouts(self.cfg.dist.timeout_s)

    def _after_optimizer_step(self, epoch: int, elapsed_s: float, preempt: PreemptionFlag, fresh: bool) -> None:
        """All ranks agree on whether to stop for a NaN/inf (read from the device when ``fresh``) and whether to
        checkpoint now (a signal may have reached only some), and do; never a checkpoint after a bad step."""
        s = self.state
        due = self.checkpointer.periodic_due(s.step)
        bad = fresh and self.guard.seen() > 0
        flags = dist.all_reduce_max(torch.tensor([int(preempt.raised), int(due), int(bad)]))
        if int(flags[2]):
            raise self.guard.stop(epoch, self.env.rank, self.lr, self.cfg)
        if not int(flags.sum()):
            return
        if not fresh and int(dist.all_reduce_max(torch.tensor([int(self.guard.seen() > 0)])).item()):
            raise self.guard.stop(epoch, self.env.rank, self.lr, self.cfg)
        s.epoch = epoch
        folder = self.checkpointer.save(s.step, self.common_state(), self.rank_state(elapsed_s))
        self.kept.last(self.model, epoch, s.step, {})  # the newest weights, beside the checkpoint (a preempted run
        # leaves them too)
        if int(flags[0]):
            raise Preempted(s.step, folder)
        log.info("checkpoint: %s", folder)

    def evaluate(self) -> dict:
        """The task's metrics on val and test (the same on every rank), in the run's precision."""
        with autocast(self.cfg.train.precision, self.device):
            return self.task.evaluate(self.model)

    def check_splits(self) -> None:
        """Collective, before the first step: the splits evaluation scores must not be empty. An empty validation
        split cannot choose the epoch reported (unless ``train.select=last``); an empty test split is reported as
        absent (no test metric, never NaN)."""
        sizes, t, d = self.task.split_sizes(), self.cfg.train, self.cfg.dataset
        if not sizes["val"] and t.select == "val":
            raise DatasetError(empty_validation(f"the validation split of dataset {d.name} is empty"))
        if not sizes["test"]:
            log.warning("the test split of dataset %s is empty: the summary reports no test metric", d.name)
        self.task.splits = tuple(s for s in ("val", "test") if sizes[s])

    def end_epoch(self, epoch: int, row: dict) -> None:
        s, select = self.state, f"val_{self.task.metric}"
        evaluated = any(k.startswith(("val_", "test_")) for k in row)
        if (self.cfg.train.select == "last" and evaluated) or \
                (select in row and (s.best_epoch == 0 or self.better(row[select], s.best[select]))):
            s.best_epoch = epoch
            s.best = {k: v for k, v in row.items() if k.startswith(("val_", "test_"))}
            self.kept.better(self.model, epoch, s.step, s.best)
        s.history.append(row)
        self.metrics.epoch_scalars(row)
        self.trackers.epoch({**row, "phases_s": getattr(self, "epoch_phases", {})})
        s.epoch, s.step_in_epoch = epoch + 1, 0
        if self.env.is_main:  # what `python -m hpcgnn status` shows while the run goes on
            write_json(Path(self.cfg.run_dir) / "progress.json", progress(self))
            evals = "".join(f" | {k.split('_', 1)[0]} {v:.4f}" for k, v in row.items()
                            if k in (f"val_{self.task.metric}", f"test_{self.task.metric}"))
            train = "".join(f" | train {k.removeprefix('train_')} {v:.4f}" for k, v in row.items()
                            if k.startswith("train_"))
            log.info("epoch %d/%d | loss %.4f%s%s | %.0f %s/s", epoch, self.cfg.train.epochs, row["loss"], train,
                     evals, row["seeds_per_s"], self.store.seeds_unit)

    def better(self, value: float, best: float) -> bool:
        """``value`` of the selecting metric beats ``best`` (lower for RMSE; NaN never beats a number)."""
        if math.isnan(best):
            return not math.isnan(value)
        return value < best if self.task.lower_is_better else value > best


def optimizer_step(opt: torch.optim.Optimizer, sched, scaler, apply: bool = True) -> None:
    """The optimizer's step (through the gradient scaler under fp16), the schedule's, and the gradients dropped;
    ``apply=False`` skips the optimizer's step alone (non-finite gradients, train.nonfinite=skip)."""
    if apply and scaler is not None:
        scaler.step(opt)
        scaler.update()
    elif apply:
        opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def train(cfg: RunConfig, env: RankEnv, device: torch.device) -> dict:
    """Train on this rank; returns the run summary (the same on every rank)."""
    return Trainer(cfg, env, device).train()
