"""``python -m hpcgnn status DIR [--wait]``: a sweep's members (state, progress, best accuracy), a tune's trials, or
one run's progress and its sampler servers (batches served, time sampling, time waiting for trainers)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hpcgnn.paths import read_text
from hpcgnn.submit.sweep import MANIFEST
from hpcgnn.submit.sweep import status_main as sweep_main


def server_rows(run_dir: Path) -> list[dict]:
    """The run's sampler servers, as they last wrote (``metrics/sampler-server-<k>.json``)."""
    rows = []
    for path in sorted((run_dir / "metrics").glob("sampler-server-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        try:
            rows.append(json.loads(read_text(path)))
        except (OSError, ValueError):
            continue
    return rows


def run_status(run_dir: Path, now: float | None = None) -> str:
    """One run's progress and its servers, as lines."""
    now = time.time() if now is None else now
    lines = []
    for name in ("summary.json", "progress.json"):
        path = run_dir / name
        try:
            p = json.loads(read_text(path))
        except (OSError, ValueError):  # (missing, or not a plain file: another user's folder may hold a FIFO)
            continue
        if isinstance(p, dict):
            done = len(p.get("history", []))
            lines.append(f"{'finished' if name == 'summary.json' else 'running'}: epoch {done}/{p.get('epochs', '?')}, "
                         + (f"best val {p['best_val']:.4f}" if isinstance(p.get("best_val"), float) else
                            "no validation metric"))
            break
    else:
        lines.append("no epoch ended yet")
    rows = server_rows(run_dir)
    if rows:
        lines.append("sampler server  host:port        batches  sampling s  waiting s  MB sent  last report")
        for r in rows:
            lines.append(f"{r['server']:<14}  {r['host'] + ':' + str(r['port']):<15}  {r['batches_served']:>7}  "
                         f"{r['sample_s']:>10.1f}  {r['wait_s']:>9.1f}  {r['bytes_sent'] / 2**20:>7.0f}  "
                         f"{now - r.get('time', now):.0f} s ago")
    return "\n".join(lines)


def tune_status(sweep: Path) -> str:
    """A tune's study: each trial's state, parameters, value, epochs and where it was pruned; the best trial and the
    command that reruns it (:func:`hpcgnn.submit.tune.results`)."""
    from hpcgnn.paths import why_not_yours
    from hpcgnn.submit.tune import results, tune_study
    from hpcgnn.submit.tune_worker import load_tune

    foreign = why_not_yours(sweep)  # (the one walk of its tree: status only looks, whoever's it is)
    _, fixed, space, _ = load_tune(sweep, check=False)
    head = f"NOT YOURS: {foreign}: what it holds is another user's; no command from it is printed\n" if foreign else ""
    return head + results(tune_study(sweep, check=False)[0], sweep, fixed, space, write_best=False, foreign=foreign)


def main(argv: list[str]) -> int:
    from hpcgnn.tuning import STUDY_FILE

    if argv and (Path(argv[0]) / STUDY_FILE).is_file():
        from hpcgnn.env import full_error
        from hpcgnn.errors import UserError, report

        try:
            print(tune_status(Path(argv[0])), flush=True)
        except UserError as exc:
            return report(exc, full_error())
        return 0
    if argv and not argv[0].startswith("-") and not (Path(argv[0]) / MANIFEST).is_file() and \
            any((Path(argv[0]) / n).exists() for n in ("summary.json", "progress.json", "metrics")):
        print(run_status(Path(argv[0])), flush=True)
        return 0
    return sweep_main(argv)


__all__ = ["main", "run_status"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
