"""The training loop: DDP over sampled mini-batches, sharded evaluation, the run summary."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from hpcgnn import dist
from hpcgnn.checkpoint import Checkpointer, Preempted, PreemptionFlag, rng_state, set_rng_state
from hpcgnn.config import RunConfig
from hpcgnn.env import RankEnv
from hpcgnn.io import write_json
from hpcgnn.metrics import StepMetrics
from hpcgnn.models import build_model, forward_batch
from hpcgnn.sampling import NodeLoader, PrefetchLoader
from hpcgnn.stores import open_store
from hpcgnn.techniques import (
    CommHook,
    autocast,
    effective_lr,
    grad_scaler,
    layerwise_inference,
    make_scheduler,
    step_weights,
)

log = logging.getLogger(__name__)


def _seed(*parts: int) -> int:
    """A 63-bit generator seed from integers, stable across processes and runs."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@torch.no_grad()
def evaluate(model: torch.nn.Module, store, split: str, cfg: RunConfig, env: RankEnv, device: torch.device) -> float:
    """Accuracy on ``split``: each rank classifies its share; counts are summed over ranks."""
    model.eval()
    mine, num_batches = store.eval_seeds(split)
    counts = torch.zeros(2, dtype=torch.float64)
    gen = torch.Generator().manual_seed(_seed(cfg.train.seed, 0xE7A1, env.rank))
    for data in NodeLoader(store.features, store.sampler, mine, cfg.train.eval_batch_size, gen, device,
                           num_batches=num_batches):
        if data.batch_size == 0:  # padding: this rank only serves the others' exchanges
            continue
        pred = forward_batch(model, data).argmax(-1)
        counts[0] += (pred == data.y[: data.batch_size]).sum().item()
        counts[1] += data.batch_size
    dist.all_reduce_sum(counts)
    return (counts[0] / counts[1]).item()


def evaluate_splits(model: torch.nn.Module, store, cfg: RunConfig, env: RankEnv, device: torch.device) -> dict:
    """Validation and test accuracy: sampled like training, or exact (``train.eval_mode=full``)."""
    if cfg.train.eval_mode == "sampled":
        return {f"{split}_acc": evaluate(model, store, split, cfg, env, device) for split in ("val", "test")}
    g = store.graph
    with autocast(cfg.train.precision, device):
        logits = layerwise_inference(model, g, device, cfg.train.eval_chunk, env.rank, env.world_size)
    pred = logits.argmax(-1)
    return {f"{split}_acc": (pred[idx] == g.y[idx]).double().mean().item()
            for split, idx in (("val", g.val_idx), ("test", g.test_idx))}


def param_checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _debug_hooks(cfg: RunConfig, env: RankEnv, step: int) -> None:
    """Fault injection for tests: fail, hang, or be preempted just before ``step``."""
    d = cfg.debug
    if env.rank == d.fail_rank and step == d.fail_step:
        raise RuntimeError(f"injected failure on rank {env.rank} at step {step} (debug.fail_rank)")
    if env.rank == d.hang_rank and step == d.hang_step:
        log.warning("rank %d hangs at step %d (debug.hang_rank)", env.rank, step)
        while True:
            time.sleep(3600)
    if env.rank == d.slow_rank:
        time.sleep(d.slow_s)
    if env.rank == d.signal_rank and step == d.signal_step:
        os.kill(os.getpid(), getattr(signal, f"SIG{cfg.checkpoint.signal}"))


def micro_step(ddp: torch.nn.Module, data, weight: float, precision: str, device: torch.device, scaler,
               sync: bool = True) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Forward and backward of one micro-batch, its loss weighted by its share of the step's seeds.

    The loss is the mean over the batch's seeds, or with ``data.node_weight`` (GraphSAINT's
    normalisation) their weighted sum; a batch without seeds still runs forward and
    backward, with a zero loss, so that DDP's all-reduce sees every rank. ``sync=False`` runs backward under DDP's ``no_sync``: gradients accumulate locally and the
    all-reduce happens once, with the last micro-batch of the step. Returns the unweighted
    loss, the logits, and the forward and backward seconds.
    """
    no_sync = getattr(ddp, "no_sync", None)
    # DDP decides at forward time whether the backward all-reduces: no_sync must hold both.
    with no_sync() if (no_sync is not None and not sync) else contextlib.nullcontext():
        t0 = time.perf_counter()
        with autocast(precision, device):
            logits = forward_batch(ddp, data)
            y = data.y[: data.batch_size]
            if data.batch_size == 0:
                loss = logits.float().sum() * 0.0
            elif "node_weight" in data:
                loss = (F.cross_entropy(logits.float(), y, reduction="none") * data.node_weight).sum()
            else:
                loss = F.cross_entropy(logits.float(), y)
        t1 = time.perf_counter()
        scaled = loss * weight
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
    return loss.detach(), logits.detach(), t1 - t0, time.perf_counter() - t1


def optimizer_step(opt: torch.optim.Optimizer, sched, scaler) -> None:
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def train(cfg: RunConfig, env: RankEnv, device: torch.device) -> dict:
    """Train on this rank; returns the run summary (the same on every rank).

    Resumes from the newest intact checkpoint of the run folder, exactly: the batches are
    seeded per (epoch, rank, step), and the model, optimizer, scheduler, RNG states, seed
    order and partial epoch sums come back as they were at the step boundary.
    """
    t_start = time.perf_counter()
    t = cfg.train
    store = open_store(cfg, env)
    steps = store.steps

    torch.manual_seed(t.seed)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = build_model(cfg.model, store.num_features, store.num_classes, len(t.fanouts)).to(device)
    lr = effective_lr(t.lr, t.lr_scaling, env.world_size, t.accumulate)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=t.weight_decay)
    opt_steps = math.ceil(steps / t.accumulate)  # optimizer steps per epoch
    sched = make_scheduler(opt, t.lr_schedule, opt_steps * t.epochs, t.warmup)
    scaler = grad_scaler(t.precision, device)
    ckpt = Checkpointer(cfg, env)
    cur = {"epoch": 1, "step_in_epoch": 0, "step": 0, "history": [], "train_time": 0.0, "seeds_done": 0,
           "best": {"val_acc": -1.0, "test_acc": 0.0, "epoch": 0}, "resumes": 0}
    mine: dict = {}
    resume_from = ckpt.latest()
    if resume_from is not None:
        common, mine = ckpt.load(resume_from)
        model.load_state_dict(common["model"])
        opt.load_state_dict(common["optimizer"])
        sched.load_state_dict(common["scheduler"])
        if scaler is not None and "scaler" in common:
            scaler.load_state_dict(common["scaler"])
        cur = {**common["cursor"], "resumes": common["cursor"]["resumes"] + 1}
        set_rng_state(mine["rng"])
        if env.is_main:
            log.info("resumed from %s: epoch %d, step %d of %d (resume %d)", resume_from, cur["epoch"],
                     cur["step_in_epoch"], steps, cur["resumes"])
    ddp, hook = model, CommHook(t.grad_compression, t.powersgd_rank)
    if env.world_size > 1:
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        ddp.register_comm_hook(hook.state, hook.hook)
    allreduce_bytes = []
    m = cfg.metrics
    metrics = StepMetrics(cfg.run_dir, env.rank, device, m.every_steps, m.straggler_factor, m.tensorboard)
    host = socket.gethostname()
    bar = env.is_main and (m.progress_bar == "on" or (m.progress_bar == "auto" and sys.stdout.isatty()))
    if env.is_main:
        log.info("training %s on %d rank(s), %s graph, %s sampler: %d steps/epoch of %s per rank, fanouts %s",
                 cfg.model.name, env.world_size, store.mode, t.sampler, steps,
                 f"~{t.edge_budget} sampled edges" if t.edge_budget else f"{t.batch_size} seeds", list(t.fanouts))
        log.info("global batch %d seeds (%d ranks x %d micro-batches x %d), lr %.3g (train.lr %.3g, scaling %s, "
                 "warmup %d steps), %s, gradient all-reduce: %s", env.world_size * t.accumulate * t.batch_size,
                 env.world_size, t.accumulate, t.batch_size, lr, t.lr, t.lr_scaling, int(t.warmup * opt_steps * t.epochs),
                 t.precision, t.grad_compression)

    preempt = PreemptionFlag(cfg.checkpoint.signal)
    try:
        for epoch in range(cur["epoch"], t.epochs + 1):
            model.train()
            resuming = bool(mine) and cur["step_in_epoch"] > 0
            if resuming:
                plan, sums, epoch_time = mine["batches"], mine["sums"], mine["epoch_time"]
            else:
                plan = store.train_batches(torch.Generator().manual_seed(_seed(t.seed, epoch)))
                sums, epoch_time, cur["step_in_epoch"] = torch.zeros(4, dtype=torch.float64), 0.0, 0
            mine = {}
            sizes = [b.numel() if store.weigh_by_seeds else 1 for b in plan]  # this rank's batches of the epoch
            weights = step_weights(dist.all_gather_object(sizes + [0] * (steps - len(sizes))), env.rank, t.accumulate)
            loader = NodeLoader(store.features, store.train_sampler, plan, None, device=device,
                                pin_memory=device.type == "cuda", num_batches=steps,
                                batch_seed=_seed(t.seed, epoch, env.rank), start=cur["step_in_epoch"])
            t0 = time.perf_counter()
            # Closed on any exit, so the prefetch thread is joined before an exception leaves the loop.
            batches = iter(PrefetchLoader(loader, t.prefetch) if t.prefetch else loader)
            if bar:
                batches = tqdm(batches, total=steps, initial=cur["step_in_epoch"], desc=f"epoch {epoch}/{t.epochs}",
                               leave=False, dynamic_ncols=True)
            with contextlib.closing(batches):
                t_ready = time.perf_counter()
                for data in batches:
                    _debug_hooks(cfg, env, cur["step"] + 1)  # (a straggler's sleep counts as its wait)
                    t1 = metrics.sync()
                    phases = {"wait_s": t1 - t_ready - data.h2d_s, "h2d_s": data.h2d_s, "sample_s": data.sample_s,
                              "gather_s": data.gather_s}
                    i = cur["step_in_epoch"]
                    last = (i + 1) % t.accumulate == 0 or i + 1 == steps  # the micro-batch that ends a step
                    loss, logits, phases["forward_s"], phases["backward_s"] = micro_step(
                        ddp, data, weights[i], t.precision, device, scaler, sync=last)
                    t3 = metrics.sync()
                    if last:
                        optimizer_step(opt, sched, scaler)
                    phases["optimizer_s"] = metrics.sync() - t3
                    phases["allreduce_s"], sent = hook.take()
                    if last and env.world_size > 1:
                        allreduce_bytes.append(sent)
                    metrics.record(cur["step"] + 1, epoch, phases, data, loss.item())
                    y = data.y[: data.batch_size]
                    sums += torch.tensor([loss.item() * y.numel(), (logits.argmax(-1) == y).sum().item(), y.numel(), 1])
                    cur["step"] += 1
                    cur["step_in_epoch"] += 1
                    if not last:  # checkpoints fall between optimizer steps, never inside one
                        t_ready = time.perf_counter()
                        continue
                    # All ranks agree on whether to checkpoint now: a signal may have reached only some.
                    flags = dist.all_reduce_max(torch.tensor([int(preempt.raised), int(ckpt.periodic_due(cur["step"]))]))
                    if int(flags.sum()):
                        elapsed = epoch_time + time.perf_counter() - t0
                        state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "scheduler": sched.state_dict(), "cursor": dict(cur, epoch=epoch)}
                        if scaler is not None:
                            state["scaler"] = scaler.state_dict()
                        folder = ckpt.save(cur["step"], state, {"batches": plan, "sums": sums, "epoch_time": elapsed,
                                                                "rng": rng_state()})
                        if int(flags[0]):
                            raise Preempted(cur["step"], folder)
                        if env.is_main:
                            log.info("checkpoint: %s", folder)
                    t_ready = time.perf_counter()
            elapsed = torch.tensor([epoch_time + time.perf_counter() - t0])
            if int(sums[3]) != steps:  # an invariant of the seed schedule; a mismatch would hang DDP next epoch
                raise RuntimeError(f"rank {env.rank} ran {int(sums[3])} steps, expected {steps}")
            dist.all_reduce_sum(sums)
            dist.all_reduce_max(elapsed)
            cur["train_time"] += elapsed.item()
            cur["seeds_done"] += int(sums[2])
            epoch_metrics = metrics.end_epoch(epoch, host)
            row = {"epoch": epoch, "loss": sums[0].item() / sums[2].item(),
                   "train_acc": sums[1].item() / sums[2].item(), "seeds_per_s": sums[2].item() / elapsed.item(),
                   "edges_per_s": sum(r["edges"] for r in epoch_metrics["ranks"]) / elapsed.item(),
                   "epoch_s": elapsed.item(), "lr": sched.get_last_lr()[0], "balance": epoch_metrics["balance"],
                   "peak_mem_mb": max(r["peak_mem_mb"] for r in epoch_metrics["ranks"]), **store.stats()}
            if epoch % t.eval_every == 0 or epoch == t.epochs:
                row.update(evaluate_splits(model, store, cfg, env, device))
                store.stats()  # evaluation traffic is not training traffic
                if row["val_acc"] > cur["best"]["val_acc"]:
                    cur["best"] = {"val_acc": row["val_acc"], "test_acc": row["test_acc"], "epoch": epoch}
            cur["history"].append(row)
            metrics.epoch_scalars(row)
            cur["epoch"], cur["step_in_epoch"] = epoch + 1, 0
            if env.is_main:  # what `python -m hpcgnn.status` shows while the run goes on
                write_json(Path(cfg.run_dir) / "progress.json",
                           {"epochs": t.epochs, "history": cur["history"], "best_val_acc": cur["best"]["val_acc"],
                            "test_acc": cur["best"]["test_acc"], "best_epoch": cur["best"]["epoch"]})
            if env.is_main:
                evals = f" | val {row['val_acc']:.4f} | test {row['test_acc']:.4f}" if "val_acc" in row else ""
                log.info("epoch %d/%d | loss %.4f | train acc %.4f%s | %.0f seeds/s", epoch, t.epochs, row["loss"],
                         row["train_acc"], evals, row["seeds_per_s"])
    finally:
        preempt.restore()
        metrics.close()
        # Free DDP's reducer now, on this thread, while the process group lives. Kept alive by an
        # exception's traceback instead, it would be freed at interpreter exit, where gloo's
        # destructor joins a worker thread that waits for the GIL: a hang at exit.
        ddp = None  # noqa: F841

    history, best = cur["history"], cur["best"]
    train_time, seeds_done = cur["train_time"], cur["seeds_done"]
    checksums = dist.all_gather_object(param_checksum(model))
    hosts = dist.all_gather_object(socket.gethostname())
    summary = {
        "test_acc": best["test_acc"],  # at the epoch of best validation accuracy
        "best_val_acc": best["val_acc"],
        "best_epoch": best["epoch"],
        "final_test_acc": history[-1]["test_acc"],
        "epochs": t.epochs,
        "steps_per_epoch": steps,
        "world_size": env.world_size,
        "num_nodes": env.num_nodes,
        "hostnames": sorted(set(hosts)),
        "rank_hosts": hosts,
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "launcher": env.source,
        "job_id": env.job_id,
        "backend": dist.pick_backend(cfg.dist, device) if env.world_size > 1 else "none",
        "device": str(device),
        "dataset": cfg.dataset.name,
        "effective_lr": lr,
        "global_batch": env.world_size * t.accumulate * t.batch_size,
        "precision": t.precision,
        "grad_compression": t.grad_compression,
        "allreduce_bytes_per_step": sum(allreduce_bytes) / len(allreduce_bytes) if allreduce_bytes else 0,
        "eval_mode": t.eval_mode,
        "sampler": t.sampler,
        "edge_budget": t.edge_budget,
        "graph_mode": store.mode,
        "resident_graph_bytes": dist.all_gather_object(store.resident_bytes()),
        "model": cfg.model.name,
        "seeds_per_s": seeds_done / train_time if train_time > 0 else 0.0,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - t_start,
        "resumes": cur["resumes"],  # times this run continued from a checkpoint
        "requeues": int(os.environ.get("SLURM_RESTART_COUNT", "0")),  # times SLURM requeued the job
        "param_checksums": checksums,
        "history": history,
        "run_dir": cfg.run_dir,
    }
    if env.is_main:
        path = write_summary(summary, Path(cfg.run_dir))
        log.info("test acc %.4f (best val %.4f at epoch %d); summary: %s", summary["test_acc"],
                 summary["best_val_acc"], summary["best_epoch"], path)
    return summary


def write_summary(summary: dict, run_dir: Path) -> Path:
    return write_json(run_dir / "summary.json", summary)

