"""Where a step's time goes, per rank, and which rank holds the others up.

Per step and rank (``<run_dir>/metrics/rank-<r>.jsonl``): waiting for the loader, and of
the batch's making (in the prefetch thread, overlapped) sampling and feature gathering;
the host-to-device copy, forward, backward, the gradient all-reduce (the span from the
first bucket's launch to the last bucket's completion, measured by a DDP comm hook; it
overlaps backward), the optimizer; seeds, sampled nodes and edges, peak memory.

Per epoch, across ranks (``<run_dir>/metrics/epochs.jsonl``, ``summary.json``'s history,
TensorBoard): load balance as max/mean and coefficient of variation of the ranks' mean
busy step time and sampled edges, and a straggler warning naming the host when a rank's p95
busy step time (the step without the all-reduce, in which a fast rank waits for the slow
one) exceeds the median rank's by ``metrics.straggler_factor``.
"""

from __future__ import annotations

import json
import logging
import resource
import statistics
import time
from pathlib import Path

import torch

from hpcgnn import dist, paths
from hpcgnn.clock import Clock
from hpcgnn.io import finite

log = logging.getLogger(__name__)

PHASES = ("wait_s", "sample_s", "gather_s", "h2d_s", "forward_s", "backward_s", "allreduce_s", "optimizer_s")
# The phases of the training thread, one after the other (sampling and gathering overlap them in the
# prefetch thread; the all-reduce overlaps backward).
ON_THE_CLOCK = ("wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s")


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of the training device: the CUDA allocator's peak on a GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return host_peak_mb()


def host_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class StepMetrics:
    """Collects one rank's step records; writes them as JSON lines; summarises epochs across ranks.

    A step is recorded with its clock marks and its loss as a device tensor; both are read on
    logging steps (every ``every_steps``, and at the end of an epoch) for all steps since the
    last read, so the hot path never waits for the device. Every step's record serves the
    epoch's balance figures; logging steps' records go to the JSON lines and TensorBoard.
    """

    def __init__(self, run_dir: str, rank: int, device: torch.device, every_steps: int, straggler_factor: float,
                 tensorboard: bool):
        self.folder = Path(run_dir) / "metrics"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank, self.device, self.every = rank, device, max(every_steps, 1)
        self.clock = Clock(device)
        self.factor = straggler_factor
        self.file = paths.open_append(self.folder / f"rank-{rank}.jsonl", "a rank's metrics")  # appended across resumes
        self.epoch_steps: list[dict] = []
        self.pending: list[tuple[dict, dict, torch.Tensor]] = []  # (record, marks, loss) not read yet
        self.writer = None
        if tensorboard and rank == 0:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
            except ImportError as exc:  # tensorboard missing: metrics still go to the JSON lines
                log.warning("TensorBoard disabled: %s", exc)

    def record(self, step: int, epoch: int, host: dict, marks: dict, data, loss: torch.Tensor) -> None:
        """One step: ``host`` phases in seconds (wait, all-reduce), ``marks`` phase -> (start, end) clock
        marks (sample and gather: where the batch was made; h2d, forward, backward, optimizer), ``loss`` a
        device scalar."""
        rec = {"step": step, "epoch": epoch, **{k: float(v) for k, v in host.items()},
               "seeds": int(data.batch_size), "nodes": int(data.num_nodes), "edges": int(data.num_edges),
               "peak_mem_mb": round(peak_memory_mb(self.device), 1), "host_peak_mb": round(host_peak_mb(), 1),
               "time": time.time()}
        if hasattr(data, "node_types"):  # a typed batch: its sampled nodes per type and edges per relation
            rec["nodes_by_type"] = {t: int(data[t].num_nodes) for t in data.node_types}
            rec["edges_by_relation"] = {"__".join(r): int(data[r].num_edges) for r in data.edge_types}
            if "remote_rows_by_type" in data:  # partitioned: feature rows of other ranks' nodes (cached or fetched)
                rec["remote_rows_by_type"] = dict(data.remote_rows_by_type)
        self.pending.append((rec, marks, loss.detach()))
        if step % self.every == 0:
            self.flush()

    def flush(self) -> None:
        """Read the pending steps' marks and losses (one wait for the device), write the logging steps."""
        if not self.pending:
            return
        last = self.pending[-1][1]
        if last:
            Clock.wait(list(last.values())[-1][1])
        losses = torch.stack([loss.float().reshape(()) for _, _, loss in self.pending]).tolist()
        for (rec, marks, _), loss in zip(self.pending, losses, strict=True):
            for k, (a, b) in marks.items():
                rec[k] = Clock.seconds(a, b)
            for k in PHASES:
                rec[k] = round(float(rec.get(k, 0.0)), 6)
            rec["step_s"] = round(sum(rec[k] for k in ON_THE_CLOCK), 6)
            # Busy: the step without the gradient all-reduce, where a fast rank waits for a slow one.
            rec["busy_s"] = round(max(rec["step_s"] - rec["allreduce_s"], 0.0), 6)
            rec["loss"] = loss
            self.epoch_steps.append(rec)
            if rec["step"] % self.every == 0:
                self.file.write(json.dumps(finite(rec)) + "\n")
                if self.writer is not None:
                    self.writer.add_scalar("train/loss", loss, rec["step"])
                    self.writer.add_scalar("time/step_s", rec["step_s"], rec["step"])
        self.pending = []

    def end_epoch(self, epoch: int, host: str) -> dict:
        """Collective: per-rank summaries gathered, balance and stragglers computed (same on all ranks)."""
        self.flush()
        self.file.flush()
        steps = self.epoch_steps
        self.epoch_steps = []
        times = [r["step_s"] for r in steps] or [0.0]
        busy = sorted(r["busy_s"] for r in steps) or [0.0]
        total = sum(times)
        mine = {"rank": self.rank, "host": host, "mean_step_s": total / len(times),
                "mean_busy_s": sum(busy) / len(busy), "p95_busy_s": busy[min(len(busy) - 1, int(0.95 * len(busy)))],
                "edges": sum(r["edges"] for r in steps),
                "phases": {k: sum(r[k] for r in steps) for k in PHASES},
                "edges_per_s": sum(r["edges"] for r in steps) / total if total else 0.0,
                "peak_mem_mb": max((r["peak_mem_mb"] for r in steps), default=0.0),
                "host_peak_mb": max((r["host_peak_mb"] for r in steps), default=0.0),
                "step_edges": [r["edges"] for r in steps]}
        ranks = dist.all_gather_object(mine)
        out = {"epoch": epoch, "balance": balance(ranks, self.factor), "ranks": ranks}
        for r in ranks:  # used for the balance; too long to keep in every epoch row
            r.pop("step_edges")
        if self.rank == 0:
            with paths.open_append(self.folder / "epochs.jsonl", "the epochs' metrics") as f:
                f.write(json.dumps(finite(out)) + "\n")
            for warning in out["balance"]["stragglers"]:
                log.warning("straggler: rank %d on %s: p95 busy step time %.3f s is %.1fx the median rank's %.3f s "
                            "(metrics.straggler_factor=%.1f)", warning["rank"], warning["host"], warning["p95_busy_s"],
                            warning["ratio"], warning["median_p95_busy_s"], self.factor)
        return out

    def epoch_scalars(self, row: dict) -> None:
        if self.writer is None:
            return
        for key, value in row.items():  # loss, train_acc, every val_* / test_* metric, throughput, lr
            if key in ("loss", "seeds_per_s", "lr") or key.startswith(("train_", "val_", "test_")):
                self.writer.add_scalar(f"epoch/{key}", value, row["epoch"])
        for key, value in row.get("balance", {}).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"balance/{key}", value, row["epoch"])
        self.writer.flush()

    def close(self) -> None:
        self.pending = []
        self.file.close()
        if self.writer is not None:
            self.writer.close()


def _cv(values: list[float]) -> float:
    mean = statistics.fmean(values) if values else 0.0
    return statistics.pstdev(values) / mean if mean else 0.0


def balance(ranks: list[dict], factor: float) -> dict:
    """Load balance of one epoch: max/mean and CV of busy step time and edges, the per-step edge
    imbalance, and stragglers by p95 busy time.

    Busy time leaves out the gradient all-reduce: under DDP every rank's step lasts as long as
    the slowest one's, but only the slow rank is busy for all of it.
    """
    step = [r["mean_busy_s"] for r in ranks]
    edges = [float(r["edges"]) for r in ranks]
    p95 = [r["p95_busy_s"] for r in ranks]
    median = statistics.median(p95) if p95 else 0.0
    stragglers = [{"rank": r["rank"], "host": r["host"], "p95_busy_s": r["p95_busy_s"], "median_p95_busy_s": median,
                   "ratio": r["p95_busy_s"] / median} for r in ranks if median > 0 and r["p95_busy_s"] > factor * median]
    # Per step, DDP waits for the rank with the most work: sum over steps of the largest rank's
    # edges over the sum of the mean rank's (1.0 = every step perfectly balanced).
    per_step = [r.get("step_edges", []) for r in ranks]
    step_max = step_mean = 0.0
    if per_step and all(len(s) == len(per_step[0]) for s in per_step):
        for column in zip(*per_step, strict=True):
            step_max, step_mean = step_max + max(column), step_mean + statistics.fmean(column)
    return {"step_edges_max_over_mean": step_max / step_mean if step_mean else 1.0,
            "step_time_max_over_mean": max(step) / statistics.fmean(step) if step and statistics.fmean(step) else 1.0,
            "step_time_cv": _cv(step),
            "edges_max_over_mean": max(edges) / statistics.fmean(edges) if edges and statistics.fmean(edges) else 1.0,
            "edges_cv": _cv(edges), "stragglers": stragglers}
