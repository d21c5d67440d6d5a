"""``python -m hpcgnn report RUN_OR_SWEEP_DIR [trust=true]``: the figures of a run or a sweep, as PNG files.

A run folder (``summary.json`` or ``progress.json``, ``metrics/``) gives:
- ``curves.png``: loss and train/val/test accuracy per epoch;
- ``phases.png``: per rank, the time of one epoch split into its phases (stacked bars);
- ``balance.png``: per epoch, max/mean and CV of the ranks' busy step time and sampled edges.

A sweep folder (``manifest.json``) gives ``sweep.png``: throughput and best accuracy per member; a tune's folder
(``study.journal``) ``history.png``, ``importances.png`` and ``intermediate.png`` (:func:`write_tune_report`).
The notebooks in ``notebooks/`` draw the same figures with the same functions. Only the
folders are read: nothing is recomputed, nothing needs the cluster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpcgnn.errors import EXIT_USER_ERROR


def load_run(run_dir: Path) -> dict:
    """The run's summary (or its progress so far) and its per-epoch metrics."""
    run_dir = Path(run_dir)
    for name in ("summary.json", "progress.json"):
        if (run_dir / name).is_file():
            run = json.loads((run_dir / name).read_text())
            break
    else:
        raise FileNotFoundError(f"{run_dir} holds neither summary.json nor progress.json: not a run folder")
    epochs_file = run_dir / "metrics" / "epochs.jsonl"
    run["epoch_metrics"] = ([json.loads(line) for line in epochs_file.read_text().splitlines() if line.strip()]
                            if epochs_file.is_file() else [])
    return run


def load_sweep(sweep_dir: Path) -> list[dict]:
    """One row per member: its overrides and, when it has run, its summary."""
    manifest = json.loads((Path(sweep_dir) / "manifest.json").read_text())
    members = manifest["members"]
    shared = set.intersection(*(set(m["overrides"]) for m in members)) if members else set()
    rows = []
    for m in members:  # labelled by what varies across the sweep
        row = {"member": m["member"], "label": " ".join(o for o in m["overrides"] if o not in shared)}
        path = Path(m["run_dir"]) / "summary.json"
        if path.is_file():
            s = json.loads(path.read_text())
            row.update(test=selected(s, "test"), val=selected(s, "best_val"), seeds_per_s=s["seeds_per_s"],
                       metric=s.get("metric", "val_acc").removeprefix("val_"))
        rows.append(row)
    return rows


def selected(summary: dict, which: str) -> float:
    """The selecting metric's best validation value (``best_val``) or its test value then (``test``);
    summaries written before the task seam named them ``best_val_acc`` and ``test_acc``."""
    value = summary.get(which, summary.get({"best_val": "best_val_acc", "test": "test_acc"}[which]))
    return float("nan") if value is None else value  # (None: the run had no such split)


def plot_curves(run: dict, ax_loss, ax_acc) -> None:
    hist = run["history"]
    epochs = [r["epoch"] for r in hist]
    ax_loss.plot(epochs, [r["loss"] for r in hist], marker="o")
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    metric = run.get("metric", "val_acc").removeprefix("val_")
    for key in ("train_acc", f"val_{metric}", f"test_{metric}"):
        pts = [(r["epoch"], r[key]) for r in hist if key in r]
        if pts:
            ax_acc.plot(*zip(*pts, strict=True), marker="o", label=key)
    ax_acc.set(xlabel="epoch", ylabel=metric if metric != "acc" else "accuracy", title=f"training accuracy, {metric}")
    ax_acc.legend()


def plot_phases(run: dict, ax) -> None:
    """Per rank, two stacked bars over the last epoch: the training thread's phases (which add up to
    its time: backward is drawn without the all-reduce span it overlaps) and the prefetch thread's."""
    if not run["epoch_metrics"]:
        ax.set_title("no metrics/epochs.jsonl")
        return
    ranks = run["epoch_metrics"][-1]["ranks"]
    x = list(range(len(ranks)))
    train = {"wait": [r["phases"]["wait_s"] for r in ranks], "h2d": [r["phases"]["h2d_s"] for r in ranks],
             "forward": [r["phases"]["forward_s"] for r in ranks],
             "backward": [max(r["phases"]["backward_s"] - r["phases"]["allreduce_s"], 0.0) for r in ranks],
             "all-reduce": [min(r["phases"]["allreduce_s"], r["phases"]["backward_s"]) for r in ranks],
             "optimizer": [r["phases"]["optimizer_s"] for r in ranks]}
    prefetch = {"sample": [r["phases"]["sample_s"] for r in ranks], "gather": [r["phases"]["gather_s"] for r in ranks]}
    for offset, stack, hatch in ((-0.2, train, None), (0.2, prefetch, "//")):
        bottom = [0.0] * len(ranks)
        for name, values in stack.items():
            ax.bar([i + offset for i in x], values, width=0.38, bottom=bottom, label=name, hatch=hatch)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(x, [f"rank {r['rank']} ({r['host']})\ntraining | prefetch" for r in ranks])
    ax.set(ylabel="seconds (last epoch)", title="where each rank's time goes")
    ax.legend(fontsize="small", ncol=2)


def plot_balance(run: dict, ax) -> None:
    em = run["epoch_metrics"]
    epochs = [e["epoch"] for e in em]
    for key in ("step_time_max_over_mean", "step_time_cv", "edges_max_over_mean", "edges_cv"):
        ax.plot(epochs, [e["balance"][key] for e in em], marker="o", label=key)
    ax.set(xlabel="epoch", title="load balance across ranks (1 / 0 = perfect)")
    ax.legend(fontsize="small")


def plot_sweep(rows: list[dict], ax_thr, ax_acc) -> None:
    done = [r for r in rows if "test" in r]
    labels = [f"{r['member']}: {r['label']}" for r in done]
    ax_thr.barh(labels, [r["seeds_per_s"] for r in done])
    ax_thr.set(xlabel="seeds/s", title="throughput per member")
    ax_acc.barh(labels, [r["test"] for r in done], label="test")
    metrics = sorted({r["metric"] for r in done}) or ["acc"]
    ax_acc.set(xlabel=f"test {'/'.join(metrics)} (at best val)", title="best epoch per member")


def write_report(folder: Path, trusted: bool = False) -> list[Path]:
    """The figures of a run, a sweep or a tune, written into its folder. The folder must be yours, every part of it
    (:func:`hpcgnn.trust.run_folder`, as predict's): what it holds is read, and the figures are written there, never
    through a link another user planted. ``trusted``: a colleague's folder you vouch for (``trust=true``)."""
    import matplotlib

    from hpcgnn import paths, trust

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    if trusted:
        paths.trust_root(folder)
    else:
        trust.run_folder(folder, "copy it into a folder of your own, or give trust=true if you trust whoever wrote "
                                 "it", "the folder to report on")
    written = []
    if (folder / "study.journal").is_file():  # a tune (hpcgnn.tuning.STUDY_FILE)
        return write_tune_report(folder, trusted)
    if (folder / "manifest.json").is_file():
        rows = load_sweep(folder)
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 1.5 + 0.5 * len(rows)), constrained_layout=True)
        plot_sweep(rows, a, b)
        written.append(_save(fig, folder / "sweep.png"))
        return written
    run = load_run(folder)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    plot_curves(run, a, b)
    written.append(_save(fig, folder / "curves.png"))
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    plot_phases(run, ax)
    written.append(_save(fig, folder / "phases.png"))
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    plot_balance(run, ax)
    written.append(_save(fig, folder / "balance.png"))
    return written


def write_tune_report(sweep: Path, trusted: bool = False) -> list[Path]:
    """A tune's figures: ``history.png`` (each trial's value, the best so far, where the pruned ones stopped),
    ``importances.png`` (each parameter's share of the value's variance: Optuna's fANOVA, from two completed
    trials on) and ``intermediate.png`` (every trial's metric per epoch, the pruned ones marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hpcgnn.submit.tune import tune_study

    study, metric = tune_study(sweep, check=not trusted)
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state.name == "COMPLETE"]
    pruned = [t for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
    lower = study.direction.name == "MINIMIZE"
    written = []
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    ax.scatter([t.number for t in done], [t.value for t in done], label="completed", color="tab:blue")
    ax.scatter([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
               marker="x", color="tab:red", label="pruned (its last report)")
    best, line = None, []
    for t in sorted(done, key=lambda t: t.number):
        best = t.value if best is None or (t.value < best if lower else t.value > best) else best
        line.append((t.number, best))
    if line:
        ax.step(*zip(*line, strict=True), where="post", color="tab:green", label="best so far")
    ax.set(xlabel="trial", ylabel=metric, title=f"optimisation history ({study.direction.name.lower()})")
    ax.legend()
    written.append(_save(fig, sweep / "history.png"))
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.5 * max(1, len(study.get_trials(deepcopy=False)[0].params) if trials
                                                              else 1)), constrained_layout=True)
    if len(done) >= 2:
        import optuna

        importances = optuna.importance.get_param_importances(study)
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names], color="tab:blue")
        ax.set(xlabel="share of the value's variance (fANOVA)", title="parameter importances")
    else:
        ax.text(0.5, 0.5, f"{len(done)} completed trial(s): importances need two", ha="center", va="center")
        ax.set_axis_off()
    written.append(_save(fig, sweep / "importances.png"))
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for t in trials:
        if t.intermediate_values:
            steps = sorted(t.intermediate_values)
            cut = t.state.name == "PRUNED"
            ax.plot(steps, [t.intermediate_values[k] for k in steps], color="tab:red" if cut else "tab:blue",
                    alpha=0.8, linestyle="--" if cut else "-", marker="x" if cut else None, markevery=[-1])
    ax.plot([], [], color="tab:blue", label="completed")
    ax.plot([], [], color="tab:red", linestyle="--", marker="x", label="pruned")
    ax.set(xlabel="epoch", ylabel=metric, title="per-epoch reports")
    ax.legend()
    written.append(_save(fig, sweep / "intermediate.png"))
    return written


def _save(fig, path: Path) -> Path:
    """The figure as a PNG at ``path``, through the one atomic writer (a planted link is refused, not written
    through)."""
    import matplotlib.pyplot as plt

    from hpcgnn.io import atomic_open

    with atomic_open(path, "wb") as f:
        fig.savefig(f, dpi=100, format="png")
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    from hpcgnn.env import full_error
    from hpcgnn.errors import UserError, report

    trusted = "trust=true" in argv
    argv = [a for a in argv if a not in ("trust=true", "trust=false")]
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        paths = write_report(Path(argv[0]), trusted)
    except UserError as exc:
        return report(exc, full_error())
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"hpcgnn: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
