"""``hpcgnn tune OVERRIDES``: a hyperparameter search with early stopping (:mod:`hpcgnn.tuning`).

    hpcgnn tune 'train.lr=tag(log, interval(1e-4, 1e-2))' 'model=choice(sage,gat)' \\
        'model.hidden_channels=choice(64,128,256)' tune.trials=64 tune.parallel=8 [hydra.sweep.dir=DIR]

Every value the space can take is composed and checked before anything runs (each choice, each end of a range).
The sweep folder holds the study (``study.journal``), what the tune was asked (``tune.json``), a run folder per
trial (``trials/<n>``: checkpoints, summary, model files, as any run's), each worker's log (``workers/<k>.log``),
and at the end the best trial's overrides (``best.yaml``). Without a cluster the workers are ``tune.parallel``
local processes, each pulling the next trial from the study and running it as a local run; this command waits
for them. The same command given the same folder (``hydra.sweep.dir=DIR``) resumes the study: trials left
running by a tune that died resume from their checkpoints; two tunes in one folder are refused by its lock.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from pathlib import Path

from hpcgnn import paths, runlock, trust
from hpcgnn.env import full_error
from hpcgnn.errors import ConfigError, UserError, report
from hpcgnn.io import atomic_open, write_json
from hpcgnn.submit.tune_worker import load_tune, trial_overrides_of
from hpcgnn.tuning import SPEC, WORKERS, OutsideSpace


def main(argv: list[str]) -> int:
    try:
        return tune(argv)
    except UserError as exc:
        return report(exc, full_error())


def plan(overrides: list[str]):
    """(fixed overrides, space, the first trial's composed config, its sweep folder): every value of the space
    composed and checked (a ConfigError names the override)."""
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import check, parse_space

    fixed, space = parse_space(overrides)
    first = [p.override(p.corners()[0]) for p in space]
    try:
        composed = compose([*fixed, *first], job_num=0)
    except ConfigError as exc:
        raise ConfigError(str(exc).strip().splitlines()[0]) from None
    parts = _parts_of(composed.cfg)
    for i, p in enumerate(space):
        for value in p.corners()[1:]:
            try:
                other = compose([*fixed, *first[:i], p.override(value), *first[i + 1:]]).cfg
            except ConfigError as exc:
                why = str(exc).strip().splitlines()[0]
                raise ConfigError(f"tune: {p.describe()}: with {p.override(value)}: {why}") from None
            if _parts_of(other) != parts:
                raise ConfigError(f"tune: {p.describe()}: with {p.override(value)} the trials' graph is partitioned "
                                  f"otherwise ({_parts_of(other) or 'replicated'}, not {parts or 'replicated'}): a "
                                  "tune's trials share one partition, made once. HINT: keep graph.mode, graph.* and "
                                  "dataset.* out of the search space")
    check(composed.cfg)
    c = composed.cfg.cluster
    if c is not None and c.samplers.nodes:
        raise ConfigError(f"tune +cluster: cluster.samplers.nodes={c.samplers.nodes}: sampler servers share a "
                          "heterogeneous job with their trainers, and a SLURM job array cannot hold one. HINT: "
                          "train.sampler_procs (sampler processes in each trial's tasks), or a sweep with -m")
    return fixed, space, composed.cfg, Path(composed.sweep_dir)


def _parts_of(cfg) -> str | None:
    """The folder of the partition a run of ``cfg`` trains on (None: a replicated graph)."""
    if cfg.graph.mode != "partitioned":
        return None
    from hpcgnn.partition import parts_folder

    return str(parts_folder(cfg.dataset, cfg.graph, cfg.graph.parts_for(cfg.world_size)))


def tune(overrides: list[str]) -> int:
    from hpcgnn.tuning import STUDY_FILE, open_study, optuna

    optuna()  # (the extra is there, before anything is written)
    fixed, space, cfg, sweep = plan(overrides)
    sweep.mkdir(parents=True, exist_ok=True)
    trust.run_folder(sweep, "use a sweep folder of your own (hydra.sweep.dir=...)", "the sweep folder")
    if cfg.cluster is not None:
        return submit_array(overrides, fixed, space, cfg, sweep)
    lock = runlock.take(sweep, "a tune's launcher")
    try:
        spec = _write_spec(sweep, overrides, cfg)  # (a resumed tune: the same search, or a clear refusal)
        metric, direction = spec["metric"], spec["direction"]
        study = open_study(cfg, sweep, direction)
        stale = [t.number for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
        t = cfg.tune
        print(f"tune: {len(space)} parameter(s) ({'; '.join(p.describe() for p in space)}), {t.trials} trials on "
              f"{t.parallel} local worker(s), {t.sampler} sampler, {t.pruner} pruner, {direction} "
              f"{metric or 'the task metric'}; sweep folder: {sweep}"
              + (f" (resuming trials {', '.join(map(str, stale))})" if stale else ""), flush=True)
        (sweep / WORKERS).mkdir(exist_ok=True)
        for number in stale:  # (a beat now, so that no worker fails them before their own worker beats)
            write_json(sweep / WORKERS / f"resume-{number}.beat", {"trial": number, "time": time.time()})
        ctx = multiprocessing.get_context("spawn")
        workers = [ctx.Process(target=_worker, args=(str(sweep), k, stale[k::t.parallel]), daemon=False)
                   for k in range(t.parallel)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for k, w in enumerate(workers):
            if w.exitcode != 0:  # (its trials' own failures are the trials': a worker's is said here, in one line)
                print(f"hpcgnn: tune worker {k} ended with exit code {w.exitcode}: its log "
                      f"{sweep / WORKERS / f'{k}.log'} says why", file=sys.stderr, flush=True)
        for path in (sweep / WORKERS).glob("resume-*.beat"):
            path.unlink()
        study = open_study(cfg, sweep)
        print(results(study, sweep, fixed, space), flush=True)
        print(f"study: {sweep / STUDY_FILE}; trials' runs: {sweep / 'trials'}", flush=True)
        return 0 if all(w.exitcode == 0 for w in workers) else 1
    finally:
        lock.release()


def _write_spec(sweep: Path, overrides: list[str], cfg, **extra) -> dict:
    """``tune.json``: what the tune was asked and the study's direction; a folder holding another tune's refused."""
    from hpcgnn.tuning import metric_of

    metric, direction = metric_of(cfg)
    path = sweep / SPEC
    before = json.loads(path.read_text()) if path.is_file() else None
    if before is not None and before["overrides"] != list(overrides):
        raise ConfigError(f"{sweep} holds a tune of other overrides ({' '.join(before['overrides'])}). HINT: "
                          "the same command to resume it, or another folder (hydra.sweep.dir=...)")
    direction = before["direction"] if before is not None else direction if direction != "auto" else \
        _task_direction(cfg)
    spec = {**(before or {}), "overrides": list(overrides), "direction": direction, "metric": metric, **extra}
    path.write_text(json.dumps(spec, indent=1))
    return spec


def submit_array(overrides: list[str], fixed: list[str], space, cfg, sweep: Path) -> int:
    """``tune.parallel`` workers as one SLURM job array (submitit's), each element one trial's resources; returns at
    once. A tune whose array still runs in the folder is refused."""
    import dataclasses

    from hpcgnn.slurm import FINAL_STATES, job_states
    from hpcgnn.submit.entry import tune_task
    from hpcgnn.submit.executor import check_partition_capacity, make_executor, submitting
    from hpcgnn.submit.launch import check_data_on_disk, check_model
    from hpcgnn.tuning import open_study

    before = json.loads((sweep / SPEC).read_text()) if (sweep / SPEC).is_file() else {}
    if before.get("job_id"):
        states = job_states([f"{before['job_id']}_{k}" for k in range(int(before.get("parallel", 1)))])
        live = [j for j, s in states.items() if s.state not in FINAL_STATES and s.state != "UNKNOWN"]
        if live:
            raise ConfigError(f"{sweep} is in use by the tune of job array {before['job_id']} ({len(live)} worker(s) "
                              f"not ended). HINT: wait for it, scancel {before['job_id']}, or another folder "
                              "(hydra.sweep.dir=...)")
    check_data_on_disk(cfg)
    check_model(cfg)
    if cfg.cluster.executor == "slurm":
        check_partition_capacity(cfg.cluster)
    spec = _write_spec(sweep, overrides, cfg)
    open_study(cfg, sweep, spec["direction"])
    (sweep / WORKERS).mkdir(exist_ok=True)
    t = cfg.tune
    after = None
    if cfg.graph.mode == "partitioned":  # one partition for every trial: made here, or by a job the array waits for
        from hpcgnn.submit.partition_job import ensure_partitioned

        after = ensure_partitioned(dataclasses.replace(cfg, run_dir=str(sweep)), "submit")
    ex = make_executor(dataclasses.replace(cfg, run_dir=str(sweep)))
    if cfg.cluster.executor == "slurm":
        ex.update_parameters(array_parallelism=t.parallel)
    if after is not None:  # the array starts only once partitioning succeeded, and is dropped otherwise
        ex.update_parameters(additional_parameters={**cfg.cluster.sbatch_extra, "dependency": f"afterok:{after.job_id}",
                                                    "kill_on_invalid_dep": "yes"})
    with submitting(), ex.batch():
        jobs = [ex.submit(tune_task, str(sweep), k) for k in range(t.parallel)]
    array = str(jobs[0].job_id).split("_")[0]
    _write_spec(sweep, overrides, cfg, job_id=array, parallel=t.parallel)
    print(f"submitted a tune of {t.trials} trials to {cfg.cluster.name}: job array {array}, {t.parallel} worker(s) "
          f"({'; '.join(p.describe() for p in space)})"
          f"{f', after partitioning job {after.job_id}' if after is not None else ''}; sweep folder: {sweep}\n"
          f"follow it with: python -m hpcgnn status {sweep}", flush=True)
    return 0


def _task_direction(cfg) -> str:
    """The direction of the task's own metric (its kind's: minimize a regression's RMSE, an ordinal MAE; else
    maximize). Where ``task.kind=auto``
    and the labels are not readable yet, a local tune prepares the graph first (its trials need it anyway); a
    cluster's maximizes, and says so."""
    from hpcgnn.specs import tasks

    spec = tasks.SPECS[cfg.task.name]
    if not spec.kinds or spec.target_check is None:  # (its metrics, every one: the task's own, whatever its labels)
        return "maximize" if all(tasks.higher_is_better(m) for m in spec.reports(cfg.task)) else "minimize"
    from hpcgnn.data import prepare
    from hpcgnn.specs import load

    check = load(spec.target_check)
    target = check(cfg.dataset, cfg.task)
    if target is None and cfg.task.kind == "auto" and cfg.cluster is not None:  # (no preparing on a login node)
        print("tune: the labels are not prepared here, so the task's kind is not known yet: the study maximizes "
              "its metric (set tune.direction=minimize, or task.kind=regression, for a regression)", flush=True)
        return "maximize"
    if target is None and cfg.task.kind == "auto":
        prepare(cfg.dataset)
        if spec.targets_prepare is not None:
            load(spec.targets_prepare)(cfg.dataset)
        target = check(cfg.dataset, cfg.task)
    kind = tasks.KINDS.get(cfg.task.kind)  # (None: auto, the labels not readable even now)
    lower = target.lower_is_better if target is not None else \
        kind is not None and not tasks.higher_is_better(kind.metric)
    return "minimize" if lower else "maximize"


def _worker(sweep_dir: str, k: int, resume: list[int]) -> None:
    """Worker ``k``: its share of the trials a dead tune left running, then the study's next trials until it has
    them all; its output in ``workers/<k>.log``."""
    import os

    log_path = Path(sweep_dir) / WORKERS / f"{k}.log"
    with paths.open_append(log_path, "a worker's log", buffering=1) as out:
        os.dup2(out.fileno(), 1)  # (the trials' ranks, processes of their own, write there too)
        os.dup2(out.fileno(), 2)
    # Python's own streams on the descriptors now: they outlive the file object above, so that what a crash prints
    # (its traceback, at exit) lands in the log, not in a closed file ("lost sys.stderr").
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
    try:
        work(sweep_dir, k, resume)
    except UserError as exc:
        raise SystemExit(report(exc, full_error())) from None


def work(sweep_dir: str, k: int, resume: list[int] = ()) -> None:
    from hpcgnn.submit.compose import compose
    from hpcgnn.submit.launch import launch
    from hpcgnn.tuning import (
        Heartbeat,
        finish,
        next_trial,
        open_study,
        running_trial,
        trial_dir,
        trial_overrides,
    )

    sweep = Path(sweep_dir)
    _, fixed, space, cfg = load_tune(sweep)
    study = open_study(cfg, sweep, worker=k)
    queue = list(resume)
    while True:
        trial = running_trial(study, queue.pop(0)) if queue else None
        if trial is None:
            trial = next_trial(study, cfg.tune.trials, space, sweep)
            if trial is None:
                break
        run_dir = trial_dir(sweep, trial.number)
        try:
            chosen = trial_overrides(trial, space)
            overrides = trial_overrides_of(sweep, fixed, space, trial.params, trial.number)
        except OutsideSpace as exc:  # (a value the search space does not offer: fails, one line, nothing runs)
            report(exc, False)
            finish(study, trial, run_dir, exc.exit_code, space, retry=False)
            continue
        print(f"--- worker {k}: trial {trial.number}: {' '.join(chosen)}", flush=True)
        t0 = time.monotonic()
        beat = Heartbeat(sweep, k, trial.number)  # (other workers tell a trial whose worker died by it)
        try:
            composed = compose(overrides)
            code = launch(composed.cfg, composed.overrides)
        except UserError as exc:
            report(exc, False)
            code = exc.exit_code
        finally:
            beat.close()
        state = finish(study, trial, run_dir, code, space, retry=code != 2)
        print(f"--- worker {k}: trial {trial.number} {state} in {time.monotonic() - t0:.1f} s", flush=True)


def results(study, sweep: Path, fixed: list[str], space, write_best: bool = True, foreign: str | None = None) -> str:
    """The study in a table (each trial's state, parameters, value, epochs), its best trial, and the command that
    reruns it; the best trial's overrides written to ``best.yaml`` (``write_best``). ``foreign``: why the folder is
    not yours: its best trial is named, but no command from it is printed to run."""
    from hpcgnn.tuning import BEST, counts, rerun_overrides, space_overrides, trial_dir

    lines, best = [], None
    with_value = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if with_value:
        best = study.best_trial
    for t in study.get_trials(deepcopy=False):
        summary = _summary(trial_dir(sweep, t.number))
        epochs = len(t.intermediate_values)
        where = f"pruned after epoch {summary.get('pruned_at')}" if t.state.name == "PRUNED" else f"{epochs} epoch(s)"
        if "repeat_of" in t.user_attrs:
            where = f"= trial {t.user_attrs['repeat_of']}"
        if "twin_running" in t.user_attrs:
            where = f"= trial {t.user_attrs['twin_running']}, then running: drawn again"
        value = f"{t.value:.4f}" if t.value is not None else "-"
        params = " ".join(f"{k}={v}" for k, v in t.params.items())
        state = "redrawn" if "twin_running" in t.user_attrs else t.state.name.lower()
        lines.append(f"  {t.number:>4}  {state:<9} {value:>8}  {where:<22} {params}"
                     + ("  <- best" if best is not None and t.number == best.number else ""))
    c = counts(study)
    head = f"tune: {sum(c.values())} trial(s): " + ", ".join(f"{v} {k}" for k, v in sorted(c.items()))
    out = [head, "  trial  state        value  epochs                 parameters", *lines]
    try:
        chosen = [*rerun_overrides(fixed), *space_overrides(space, best.params, best.number)] if best is not None else None
    except OutsideSpace as exc:
        out.append(f"best: none written: {exc}")
        best = None
    if best is not None:
        if write_best:
            with atomic_open(sweep / BEST) as f:
                f.write(f"# the best trial's overrides (hpcgnn tune): python -m hpcgnn $(grep -v '^#' {BEST})\n"
                        + "".join(f"{o}\n" for o in chosen))
        if foreign is not None:
            out.append(f"best: trial {best.number}, {best.value:.4f}; NOT YOURS ({foreign}): no command to rerun it is "
                       "printed, as its overrides may name another user's code. HINT: copy the folder into one of "
                       "your own and read its best.yaml before you use it")
            return "\n".join(out)
        out.append(f"best: trial {best.number}, {best.value:.4f}; rerun it: python -m hpcgnn {' '.join(chosen)}  "
                   f"(overrides in {sweep / BEST})")
    return "\n".join(out)


def _summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def tune_study(sweep: Path, check: bool = True):
    """A tune's study, read from its folder, and the metric it optimises (its name, for figures); ``check``: as
    :func:`hpcgnn.submit.tune_worker.load_tune`."""
    from hpcgnn.tuning import open_study

    spec, _, _, cfg = load_tune(sweep, check)
    metric = spec.get("metric")
    for summary in sorted(sweep.glob("trials/*/summary.json")) if metric is None else []:  # (auto: the task's own)
        metric = json.loads(summary.read_text()).get("tune_metric")
        break
    return open_study(cfg, sweep), metric or "the task's validation metric"
