"""Sweeps: ``python -m hpcgnn -m model=sage,gat train.lr=1e-3,3e-3 +cluster=NAME``.

Hydra expands the sweep and gives every member its own output folder and resolved
config (``.hydra/``); hpcgnn collects the members, validates them all, and only then
submits: members with the same cluster resources go out together as one SLURM job
array (submitit's ``executor.batch()``), others as arrays of their own. The command
returns at once with the sweep folder, whose ``manifest.json`` lists members, job ids,
overrides and run folders; ``python -m hpcgnn status SWEEP_DIR`` reads it at any later
time, from any shell. Without a cluster the members run here one after another.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcgnn import trust
from hpcgnn.config import RunConfig
from hpcgnn.errors import EXIT_USER_ERROR
from hpcgnn.io import write_json
from hpcgnn.paths import read_text, why_not_yours
from hpcgnn.slurm import FINAL_STATES, job_states
from hpcgnn.submit.report import selected

MANIFEST = "manifest.json"


@dataclass
class SweepMember:
    num: int
    overrides: list[str]
    cfg: RunConfig
    job_id: str | None = None
    state: str = "PENDING"


def write_manifest(sweep_dir: Path, members: list[SweepMember], cluster: str | None) -> Path:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    trust.run_folder(sweep_dir, "use a sweep folder of your own (hydra.sweep.dir=...)", "the sweep folder")
    data = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "cluster": cluster, "command": sys.argv,
            "members": [{"member": m.num, "overrides": m.overrides, "run_dir": m.cfg.run_dir, "job_id": m.job_id,
                         "state": m.state} for m in members]}
    return write_json(sweep_dir / MANIFEST, data)


def launch_sweep(members: list[SweepMember], sweep_dir: Path) -> int:
    """Submit (or run here) every member; returns the exit code."""
    from hpcgnn.submit.executor import check_partition_capacity, make_executor, submitting
    from hpcgnn.submit.launch import check_data_on_disk, check_model, launch, record_config
    from hpcgnn.trust import run_secret

    members = sorted(members, key=lambda m: m.num)
    for m in members:  # grouped in the trackers (a W&B group, an MLflow parent run): the sweep's folder
        if m.cfg.metrics.trackers and not m.cfg.metrics.group:
            m.cfg = dataclasses.replace(m.cfg, metrics=dataclasses.replace(m.cfg.metrics, group=str(sweep_dir)))
    first = members[0].cfg
    if first.cluster is None:
        write_manifest(sweep_dir, members, None)
        print(f"sweep of {len(members)} members, run here one after another; sweep folder: {sweep_dir}", flush=True)
        worst = 0
        for m in members:
            print(f"--- member {m.num}: {' '.join(m.overrides)}", flush=True)
            code = launch(m.cfg, m.overrides)
            m.state = "COMPLETED" if code == 0 else "FAILED"
            write_manifest(sweep_dir, members, None)
            worst = max(worst, code)
        return worst

    from hpcgnn.submit.entry import run_task

    for m in members:  # everything checked before the first submission
        check_data_on_disk(m.cfg)
        check_model(m.cfg)
        if m.cfg.cluster is not None and m.cfg.cluster.executor == "slurm":
            check_partition_capacity(m.cfg.cluster)
    groups: dict[str, list[SweepMember]] = {}
    single: list[SweepMember] = []
    for m in members:
        if m.cfg.cluster is None or _needs_partition_job(m.cfg):
            single.append(m)
        else:
            groups.setdefault(json.dumps(dataclasses.asdict(m.cfg.cluster), sort_keys=True), []).append(m)
    for group in groups.values():
        # One executor (folder and resources) per array; each member keeps its own run folder.
        array_cfg = dataclasses.replace(group[0].cfg, run_dir=str(sweep_dir))
        ex = make_executor(array_cfg)
        for m in group:
            record_config(m.cfg, m.overrides)
            run_secret(m.cfg.run_dir)
        with submitting(), ex.batch():
            jobs = [ex.submit(run_task, m.cfg) for m in group]
        for m, job in zip(group, jobs, strict=True):
            m.job_id = str(job.job_id)
    for m in single:  # parts to make first: their own job, after a partitioning job
        code = launch(dataclasses.replace(m.cfg, launch=dataclasses.replace(m.cfg.launch, wait=False)), m.overrides)
        m.state = "SUBMITTED" if code == 0 else "FAILED"
    path = write_manifest(sweep_dir, members, first.cluster.name)
    arrays = {m.job_id.split("_")[0] for m in members if m.job_id}
    print(f"submitted a sweep of {len(members)} members to {first.cluster.name} as {len(arrays)} job array(s) "
          f"({', '.join(sorted(arrays))}); sweep folder: {sweep_dir}", flush=True)
    print(f"manifest: {path}\nfollow it with: python -m hpcgnn status {sweep_dir}", flush=True)
    if first.launch.wait is True:
        return status_main([str(sweep_dir), "--wait"])
    return 0


def _needs_partition_job(cfg: RunConfig) -> bool:
    if cfg.graph.mode != "partitioned":
        return False
    from hpcgnn.partition import parts_ready

    return not parts_ready(cfg.dataset, cfg.graph, cfg.graph.parts_for(cfg.world_size))


# ------------------------------------------------------------------------------------- status


def member_row(entry: dict, state: str) -> dict:
    run = Path(entry["run_dir"])
    row = {"member": entry["member"], "overrides": " ".join(entry["overrides"]), "state": state,
           "epochs": "-", "val": "-", "test": "-", "seeds_per_s": "-"}
    progress = None
    for name in ("summary.json", "progress.json"):
        try:
            progress = json.loads(read_text(run / name))
            break
        except (OSError, ValueError):
            continue
    if progress:
        history = progress.get("history", [])
        row["epochs"] = f"{len(history)}/{progress.get('epochs', '?')}"
        best = selected(progress, "best_val")
        if best >= 0:
            row["val"] = f"{best:.4f}"
        test = selected(progress, "test")
        if progress.get("best_epoch") and not math.isnan(test):
            row["test"] = f"{test:.4f}"
        if history:
            row["seeds_per_s"] = f"{history[-1].get('seeds_per_s', 0):.0f}"
    if (run / "summary.json").exists() and state in ("UNKNOWN", "PENDING", "SUBMITTED", "RUNNING"):
        row["state"] = "COMPLETED" if state != "RUNNING" else state
    elif any((run / "failures").glob("*.json")) and state in ("UNKNOWN", "SUBMITTED"):
        row["state"] = "FAILED"
    return row


def status_table(sweep_dir: Path) -> tuple[str, list[dict]]:
    manifest = json.loads(read_text(sweep_dir / MANIFEST))
    entries = manifest["members"]
    asked = job_states([e["job_id"] for e in entries if e.get("job_id")]) if manifest.get("cluster") else {}
    states = {jid: js.state for jid, js in asked.items() if js.state != "UNKNOWN"}
    rows = [member_row(e, states.get(str(e.get("job_id")), e.get("state", "UNKNOWN"))) for e in entries]
    cols = ("member", "overrides", "state", "epochs", "val", "test", "seeds_per_s")
    heads = ("member", "overrides", "state", "epochs", "best val", "test", "seeds/s")
    widths = [max(len(h), *(len(str(r[c])) for r in rows)) for c, h in zip(cols, heads, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)) for r in rows]
    foreign = why_not_yours(sweep_dir)
    if foreign:  # (its overrides are another user's: marked, not to be copied into a command unread)
        lines.insert(0, f"NOT YOURS: {foreign}: its members' overrides are another user's; read them before you run "
                        "any")
    return "\n".join(lines), rows


def status_main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m hpcgnn status",
                                 description="State, progress and best accuracy of every member of a sweep.")
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--wait", action="store_true", help="wait until every member has ended")
    ap.add_argument("--poll-s", type=float, default=10.0)
    args = ap.parse_args(argv)
    if not (args.sweep_dir / MANIFEST).is_file():
        print(f"hpcgnn: {args.sweep_dir / MANIFEST} not found: give the sweep folder that `python -m hpcgnn -m` "
              "printed, or a run's output folder", file=sys.stderr)
        return EXIT_USER_ERROR
    while True:
        table, rows = status_table(args.sweep_dir)
        done = all(r["state"] in FINAL_STATES for r in rows)
        if done or not args.wait:
            print(table, flush=True)
            return 0 if all(r["state"] == "COMPLETED" for r in rows) or not done else 1
        time.sleep(args.poll_s)
