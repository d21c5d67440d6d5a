"""A tune's worker in a job array's element (``hpcgnn tune +cluster=NAME``; :class:`hpcgnn.submit.entry.TuneTask`
runs it in every task): trials pulled from the study one after another, each trained by the element's tasks as its
ranks."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpcgnn import paths, trust
from hpcgnn.errors import report
from hpcgnn.tuning import SPEC, WORKERS, OutsideSpace


def load_tune(sweep: Path, check: bool = True):
    """A tune's folder read back: (tune.json, its fixed overrides, its space, the config of its first values: what
    every worker, ``status`` and ``report`` build the study from). ``check``: the folder, every part of it, must be
    yours (:func:`hpcgnn.trust.run_folder`: its tune.json and study become overrides that are composed and run);
    ``status`` only looks, and says whose it is."""
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import parse_space

    if check:
        trust.run_folder(sweep, "use a sweep folder of your own (hydra.sweep.dir=...)", "the tune's folder")
        spec = json.loads(paths.read_own(sweep / SPEC, "the tune's tune.json"))
    else:
        spec = json.loads((sweep / SPEC).read_text())
    fixed, space = parse_space(spec["overrides"])
    return spec, fixed, space, compose([*fixed, *(p.override(p.corners()[0]) for p in space)]).cfg


def array_worker(sweep_dir: str, k: int, environ) -> None:
    """Worker ``k`` of a tune's array, in every task of its element: task 0 asks the study for each next trial (its
    own trial first, where a requeue stopped it) and names it in ``workers/<k>/r<restart>/<i>.json``; every task
    reads the name and trains the trial as one of its ranks; task 0 tells the study what it gave."""
    import itertools

    from hpcgnn.env import RankEnv, read_int
    from hpcgnn.io import write_json
    from hpcgnn.rank.checkpoint import Preempted
    from hpcgnn.rank.job import run_rank
    from hpcgnn.submit.compose import compose, record_config
    from hpcgnn.tuning import Heartbeat, finish, next_trial, open_study, running_trial, trial_dir

    sweep = Path(sweep_dir)
    _, fixed, space, base = load_tune(sweep)
    env = RankEnv.from_environ(environ, (base.dist.port_min, base.dist.port_max), base.dist.master_port)
    leader = env.rank == 0
    study = open_study(base, sweep, worker=k)
    names = sweep / WORKERS / str(k) / f"r{read_int('restart_count', environ) or 0}"
    current = sweep / WORKERS / f"{k}.json"  # the trial this worker runs (a requeue resumes it)
    names.mkdir(parents=True, exist_ok=True)
    for i in itertools.count():
        if leader:
            trial = running_trial(study, json.loads(current.read_text())["trial"]) if current.is_file() else None
            while True:
                trial = trial or next_trial(study, base.tune.trials, space, sweep)
                number = trial.number if trial is not None else None
                try:
                    overrides = trial_overrides_of(sweep, fixed, space, trial.params, number) if trial else None
                    break
                except OutsideSpace as exc:  # (fails, one line; the next one is drawn)
                    report(exc, False)
                    finish(study, trial, trial_dir(sweep, number), exc.exit_code, space, retry=False)
                    trial = None
            if trial is not None:
                current.write_text(json.dumps({"trial": number}))
                cfg = compose(overrides).cfg
                Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
                record_config(cfg, overrides)
                trust.run_secret(cfg.run_dir)
            write_json(names / f"{i}.json", {"trial": number, "overrides": overrides})
        else:
            said = _wait_for(names / f"{i}.json", base.dist.init_timeout_s)
            number, overrides = said["trial"], said["overrides"]
            cfg = compose(overrides).cfg if number is not None else None
        if number is None:
            return
        beat = Heartbeat(sweep, k, number) if leader else None
        code, preempted = 0, False
        try:
            run_rank(cfg, environ)
        except (Preempted, SystemExit) as exc:  # a preemption's requeue (hpcgnn.rank.job._requeue) leaves this way
            preempted = not isinstance(exc, SystemExit) or exc.code not in (0, None)
            if preempted:
                raise
        except Exception as exc:  # (recorded in the trial's folder; the worker goes on)
            code = getattr(exc, "exit_code", 1)
        finally:
            if beat is not None:
                beat.close(preempted)
        if leader:
            finish(study, trial, trial_dir(sweep, number), code, space, retry=code != 2)
            current.unlink(missing_ok=True)


def trial_overrides_of(sweep: Path, fixed: list[str], space, params: dict, number: int) -> list[str]:
    """A trial's overrides: the fixed ones (not the tune's run folders), the tune's settings, its values, and
    where it reports and runs."""
    from hpcgnn.tuning import STUDY_FILE, rerun_overrides, space_overrides, trial_dir

    settings = [o for o in fixed if o.lstrip("+~").startswith("tune.")]
    return [*rerun_overrides(fixed), *settings, *space_overrides(space, params, number),
            f"tune.trial={number}", f"tune.study={sweep / STUDY_FILE}", f"metrics.group={sweep}",
            f"hydra.run.dir={trial_dir(sweep, number)}"]


def _wait_for(path: Path, within_s: float) -> dict:
    deadline = time.monotonic() + within_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {within_s:.0f} s: the worker's task 0 did not name its "
                               "next trial (its log says why)")
        time.sleep(0.5)
    return json.loads(path.read_text())
