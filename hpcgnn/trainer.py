"""The training loop: DDP over sampled mini-batches, sharded evaluation, the run summary."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.env import RankEnv
from hpcgnn.models import build_model, forward_batch
from hpcgnn.sampling import NodeLoader, PrefetchLoader
from hpcgnn.stores import open_store

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


def param_checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train(cfg: RunConfig, env: RankEnv, device: torch.device) -> dict:
    """Train on this rank; returns the run summary (the same on every rank)."""
    t_start = time.perf_counter()
    t = cfg.train
    store = open_store(cfg, env)

    torch.manual_seed(t.seed)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = build_model(cfg.model, store.num_features, store.num_classes, len(t.fanouts)).to(device)
    ddp = model
    if env.world_size > 1:
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    steps = store.steps
    if env.is_main:
        log.info("training %s on %d rank(s), %s graph: %d steps/epoch of %d seeds per rank, fanouts %s",
                 cfg.model.name, env.world_size, store.mode, steps, t.batch_size, list(t.fanouts))

    history, best = [], {"val_acc": -1.0, "test_acc": 0.0, "epoch": 0}
    train_time, seeds_done, step = 0.0, 0, 0
    for epoch in range(1, t.epochs + 1):
        model.train()
        seeds = store.train_seeds(torch.Generator().manual_seed(_seed(t.seed, epoch)))
        gen = torch.Generator().manual_seed(_seed(t.seed, epoch, env.rank))
        sums = torch.zeros(4, dtype=torch.float64)  # loss * n, correct, n, steps
        t0 = time.perf_counter()
        loader = NodeLoader(store.features, store.sampler, seeds, t.batch_size, gen, device,
                            pin_memory=device.type == "cuda", num_batches=steps)
        for data in PrefetchLoader(loader, t.prefetch) if t.prefetch else loader:
            step += 1
            if env.rank == cfg.debug.fail_rank and step == cfg.debug.fail_step:
                raise RuntimeError(f"injected failure on rank {env.rank} at step {step} (debug.fail_rank)")
            opt.zero_grad(set_to_none=True)
            logits = forward_batch(ddp, data)
            y = data.y[: data.batch_size]
            loss = F.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            sums += torch.tensor([loss.item() * y.numel(), (logits.argmax(-1) == y).sum().item(), y.numel(), 1])
        elapsed = torch.tensor([time.perf_counter() - t0])
        if int(sums[3]) != steps:  # an invariant of rank_seeds; a mismatch would hang DDP at the next epoch
            raise RuntimeError(f"rank {env.rank} ran {int(sums[3])} steps, expected {steps}")
        dist.all_reduce_sum(sums)
        dist.all_reduce_max(elapsed)
        train_time += elapsed.item()
        seeds_done += int(sums[2])
        row = {"epoch": epoch, "loss": sums[0].item() / sums[2].item(), "train_acc": sums[1].item() / sums[2].item(),
               "seeds_per_s": sums[2].item() / elapsed.item(), "epoch_s": elapsed.item(), **store.stats()}
        if epoch % t.eval_every == 0 or epoch == t.epochs:
            row["val_acc"] = evaluate(model, store, "val", cfg, env, device)
            row["test_acc"] = evaluate(model, store, "test", cfg, env, device)
            store.stats()  # evaluation traffic is not training traffic
            if row["val_acc"] > best["val_acc"]:
                best = {"val_acc": row["val_acc"], "test_acc": row["test_acc"], "epoch": epoch}
        history.append(row)
        if env.is_main:
            evals = f" | val {row['val_acc']:.4f} | test {row['test_acc']:.4f}" if "val_acc" in row else ""
            log.info("epoch %d/%d | loss %.4f | train acc %.4f%s | %.0f seeds/s", epoch, t.epochs, row["loss"],
                     row["train_acc"], evals, row["seeds_per_s"])

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
        "graph_mode": store.mode,
        "resident_graph_bytes": dist.all_gather_object(store.resident_bytes()),
        "model": cfg.model.name,
        "seeds_per_s": seeds_done / train_time if train_time > 0 else 0.0,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - t_start,
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
    """Write ``summary.json`` atomically: readers never see half a file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "summary.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
