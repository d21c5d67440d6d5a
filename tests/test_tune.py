"""hpcgnn tune: the search space in Hydra's sweep grammar, what it refuses before anything runs, local workers
pulling trials from one Optuna study in the sweep folder, pruning that really stops trials, status, resuming a
study, and the folder's lock."""

from __future__ import annotations

import json
import math

import pytest
from conftest import DATA_ROOT, run_cli

from hpcgnn.errors import ConfigError

pytest.importorskip("optuna")

TINY = ["dataset.num_nodes=3000", "model.hidden_channels=16", "train.batch_size=256", "launch.procs=1",
        "train.precision=fp32", "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}"]


def test_the_sweep_grammar_becomes_a_search_space():
    from hpcgnn.tuning import parse_space

    fixed, space = parse_space(["train.epochs=3", "model=choice(sage,gat)", "train.lr=tag(log, interval(1e-4, 1e-2))",
                                "model.hidden_channels=range(16,80,16)", "train.weight_decay=interval(0.0, 0.1)",
                                "train.batch_size=128,256"])
    assert fixed == ["train.epochs=3"]
    by = {p.key: p for p in space}
    assert by["model"].choices == ("sage", "gat") and by["train.batch_size"].choices == (128, 256)
    lr = by["train.lr"].distribution()
    assert (lr.low, lr.high, lr.log) == (1e-4, 1e-2, True)
    hidden = by["model.hidden_channels"].distribution()
    assert (type(hidden).__name__, hidden.low, hidden.high, hidden.step) == ("IntDistribution", 16, 64, 16)
    assert by["train.weight_decay"].distribution().log is False


@pytest.mark.parametrize("args, message", [
    (["train.nope=choice(1,2)"], r"Unknown config key 'train.nope'"),
    (["train.lr=choice()"], r"tune: train.lr=choice\(\) offers no value. HINT: train.lr=choice\(a,b\)"),
    (["train.lr=interval(0.1, 0.01)"], r"tune: train.lr=interval\(0.1, 0.01\): its low \(0.1\) must be below its "
                                       r"high \(0.01\)"),
    (["train.lr=tag(log, interval(0, 0.1))"], r"a log scale needs values above 0 \(got a low of 0\)"),
    (["train.lr=choice(0.1,0.2)", "tune.trials=2", "tune.parallel=3"],
     r"tune.parallel=3 workers for tune.trials=2: some would have nothing to do. HINT: tune.parallel=2 or fewer"),
    (["train.lr=choice(0.1,0.2)", "tune.metric=val_auc"],
     r"tune.metric=val_auc: task=node reports val_acc, val_rocauc, val_ap, val_f1, val_rmse, val_mae, val_r2"),
    (["model=choice(sage,nope)"], r"tune: model in \{sage, nope\}: with model=nope: .*Could not find 'model/nope'"),
    (["train.epochs=2"], r"tune: no search space among the overrides"),
    (["train.lr=choice(0.1,0.2)", "tune.reduction_factor=1"],
     r"tune.reduction_factor=1: 1 trial in this many goes on at each rung, so every trial would. HINT: "),
])
def test_a_bad_search_space_exits_2_with_one_line_before_anything_is_written(args, message, tmp_path, capsys):
    from hpcgnn.submit.tune import main

    assert main([*args, f"hydra.sweep.dir={tmp_path / 'sweep'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hpcgnn: config error: "), err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_local_tune_prunes_a_hopeless_region_and_reports_its_study(tmp_path):
    """One worker, eight trials over a learning rate that learns (1e-2) and one that cannot (1e-6), the median
    pruner: every hopeless trial after the first good one stops within 2 epochs and its folder says so; a trial
    drawing a finished one's parameters takes its result; status shows the study, the best trial and the command
    that reruns it; best.yaml holds its overrides."""
    sweep = tmp_path / "sweep"
    res = run_cli("tune", "train.lr=choice(0.01,0.000001)", "model.hidden_channels=choice(16,24)", *TINY,
                  "train.epochs=5", "tune.trials=8", "tune.parallel=1", "tune.pruner=median", "tune.sampler=random",
                  f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import open_study

    study = open_study(compose(["tune.pruner=median", "tune.sampler=random"]).cfg, sweep)
    trials = study.get_trials()
    assert len(trials) == 8 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    # six draws from four combinations: a repeat takes its earlier trial's result, trained once, no folder
    repeats = [t for t in trials if "repeat_of" in t.user_attrs]
    assert repeats, [(t.number, t.params) for t in trials]
    for t in repeats:
        first = trials[t.user_attrs["repeat_of"]]
        assert (t.params, t.state, t.value) == (first.params, first.state, first.value) and "repeat_of" not in \
            first.user_attrs and not (sweep / "trials" / str(t.number)).exists()
    assert len({tuple(t.params.items()) for t in trials}) == len(trials) - len(repeats)
    pruned = [t for t in trials if t.state.name == "PRUNED" and t not in repeats]
    assert pruned, [(t.number, t.params, t.state.name) for t in trials]  # (the seeded draws hold both rates)
    for t in pruned:  # the hopeless rate alone, stopped within 2 epochs, its folder saying so
        summary = json.loads((sweep / "trials" / str(t.number) / "summary.json").read_text())
        assert t.params["train.lr"] == 0.000001 and 1 <= summary["pruned_at"] <= 2, (t.number, summary["pruned_at"])
        assert len(summary["history"]) == summary["pruned_at"]
    best = study.best_trial
    assert best.params["train.lr"] == 0.01
    summary = json.loads((sweep / "trials" / str(best.number) / "summary.json").read_text())
    assert math.isclose(best.value, summary["tune_value"]) and summary["pruned_at"] == 0
    status = run_cli("status", str(sweep), cwd=tmp_path)
    assert f"best: trial {best.number}, {best.value:.4f}; rerun it: python -m hpcgnn" in status.stdout
    assert "pruned after epoch" in status.stdout and f"= trial {repeats[0].user_attrs['repeat_of']}" in status.stdout
    best_file = (sweep / "best.yaml").read_text()
    assert "train.lr=0.01" in best_file and "tune." not in best_file.split("\n", 1)[1]
    from hpcgnn.submit.report import write_report

    figures = write_report(sweep)
    assert figures == [sweep / f"{n}.png" for n in ("history", "importances", "intermediate")]
    assert all(f.stat().st_size > 10_000 for f in figures)
    again = run_cli("train.epochs=1", f"+tune.best={sweep / 'best.yaml'}", cwd=tmp_path / "again")
    assert again.returncode == 0, again.stderr
    cfg = json.loads((tmp_path / "again" / "run" / "summary.json").read_text())
    assert cfg["effective_lr"] == 0.01 and cfg["epochs"] == 1  # (its overrides, then the command's own)


@pytest.mark.slow
def test_the_same_command_resumes_the_study_and_a_second_tune_in_the_folder_is_refused(tmp_path):
    """A trial a dead tune left running (asked, never told) is run again in its own folder when the same command
    is given the sweep folder, and the study then holds every trial once; while a tune holds the folder, another
    is refused with one line."""
    from hpcgnn import runlock
    from hpcgnn.submit.compose import compose
    from hpcgnn.submit.tune import SPEC
    from hpcgnn.tuning import open_study, parse_space

    sweep = tmp_path / "sweep"
    args = ["tune", "train.lr=choice(0.01,0.02)", *TINY, "train.epochs=2", "tune.trials=2", "tune.parallel=1",
            "tune.pruner=none", f"hydra.sweep.dir={sweep}"]
    sweep.mkdir(mode=0o700)
    cfg = compose(["tune.pruner=none"]).cfg
    fixed, space = parse_space(args[1:])
    given = [*args[1:], f"dataset.root={DATA_ROOT}", f"hydra.run.dir={tmp_path / 'run'}"]  # (as run_cli gives them)
    (sweep / SPEC).write_text(json.dumps({"overrides": given, "direction": "maximize", "metric": None}))
    left = open_study(cfg, sweep, "maximize").ask({p.key: p.distribution() for p in space})  # (a dead tune's)
    held = runlock.take(sweep, "another tune")
    busy = run_cli(*args, cwd=tmp_path)
    assert busy.returncode == 2 and f"the run folder {sweep} is in use by another tune" in busy.stderr, busy.stderr
    held.release()
    res = run_cli(*args, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"(resuming trials {left.number})" in res.stdout
    study = open_study(cfg, sweep)
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"]
    assert (sweep / "trials" / str(left.number) / "summary.json").is_file()
    again = run_cli(*args, cwd=tmp_path, timeout=120)  # (nothing left to do)
    assert again.returncode == 0 and len(open_study(cfg, sweep).get_trials()) == 2


def test_a_tune_on_a_cluster_refuses_what_its_array_cannot_run(tmp_path):
    """Sampler servers (a heterogeneous job, which no array holds) are refused; a partitioned graph is tuned when
    every trial trains on one partition, and a space that would partition the graph otherwise is refused."""
    from hpcgnn.submit.tune import plan

    with pytest.raises(ConfigError, match=r"tune \+cluster: cluster.samplers.nodes=1: sampler servers share a "
                                          r"heterogeneous job with their trainers, and a SLURM job array cannot hold "
                                          r"one. HINT: train.sampler_procs"):
        plan(["train.lr=choice(0.1,0.2)", "+cluster=devcluster", "cluster.samplers.nodes=1",
              f"hydra.sweep.dir={tmp_path}"])
    cfg = plan(["train.lr=choice(0.1,0.2)", "+cluster=devcluster", "graph=partitioned",
                f"hydra.sweep.dir={tmp_path}"])[2]
    assert cfg.graph.mode == "partitioned"
    for space in ("graph.num_parts=choice(2,4)", "graph=choice(replicated,partitioned)"):
        with pytest.raises(ConfigError, match=r"the trials' graph is partitioned otherwise .*: a tune's trials share "
                                              r"one partition, made once. HINT: keep graph.mode, graph.\* and "
                                              r"dataset.\* out of the search space"):
            plan(["train.lr=choice(0.1,0.2)", space, "+cluster=devcluster", "graph=partitioned",
                  f"hydra.sweep.dir={tmp_path}"])


def test_a_running_trial_whose_worker_stopped_beating_is_failed_and_tried_again_once(tmp_path):
    """Two trials running: one whose worker's beat is fresh, one whose beat is older than the limit (its worker
    died). The stale one is told failed and its parameters enqueued once; a retry that goes stale is not retried
    again; the fresh one runs on."""
    import time

    from hpcgnn.io import write_json
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import STALE_S, fail_stale, open_study, parse_space

    _, space = parse_space(["train.lr=choice(0.01,0.02,0.03)"])
    dist = {p.key: p.distribution() for p in space}
    study = open_study(compose([]).cfg, tmp_path, "maximize")
    alive, dead, away = study.ask(dist), study.ask(dist), study.ask(dist)
    now = time.time() + STALE_S + 5  # (all started "long ago"; one worker beats now, one was preempted)
    write_json(tmp_path / "workers" / "0.beat", {"trial": alive.number, "time": now})
    write_json(tmp_path / "workers" / "1.beat", {"trial": dead.number, "time": now - STALE_S - 1})
    write_json(tmp_path / "workers" / "2.beat", {"trial": away.number, "time": 0.0, "preempted": True})
    assert fail_stale(study, tmp_path, now) == [dead.number]
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {alive.number: "RUNNING", dead.number: "FAIL", away.number: "RUNNING", away.number + 1: "WAITING"}
    retry = study.ask(dist)  # (the enqueued retry comes first, with the dead trial's parameters)
    assert retry.params == dead.params and retry.user_attrs == {"retry": 1, "retry_of": dead.number}
    assert fail_stale(study, tmp_path, now + 10 * STALE_S) == [alive.number, retry.number]  # (not the preempted)
    waiting = [t for t in study.get_trials() if t.state.name == "WAITING"]
    assert [t.user_attrs["retry_of"] for t in waiting] == [alive.number]  # (the retry itself is not retried)


def test_a_trial_drawing_a_finished_trials_parameters_takes_its_result_instead_of_training_again(tmp_path):
    """A run given the same config gives the same floats, so a trial whose parameters a finished trial had (a
    sampler over choices draws them again) is told that trial's value, or pruned, and marked; a running trial's
    parameters and a failed trial's retry are run."""
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import open_study, parse_space, repeated, reuse

    _, space = parse_space(["train.lr=choice(0.01,0.02,0.03)"])
    study = open_study(compose([]).cfg, tmp_path, "maximize")

    def ask(lr: float, **attrs):
        study.enqueue_trial({"train.lr": lr}, user_attrs=attrs or None)
        return study.ask({p.key: p.distribution() for p in space})

    done, cut, running = ask(0.01), ask(0.02), ask(0.03)
    study.tell(done, 0.75)
    study.tell(cut, state=__import__("optuna").trial.TrialState.PRUNED)
    again = ask(0.01)
    assert repeated(study, again).number == done.number and reuse(study, again, repeated(study, again)) == "complete"
    pruned_again = ask(0.02)
    assert reuse(study, pruned_again, repeated(study, pruned_again)) == "pruned"
    assert repeated(study, ask(0.03)) is None  # (its twin still runs)
    assert repeated(study, ask(0.01, retry=1, retry_of=running.number)) is None
    trials = study.get_trials()
    assert (trials[again.number].value, trials[again.number].user_attrs) == (0.75, {"repeat_of": done.number})
    assert trials[pruned_again.number].state.name == "PRUNED"
    assert trials[pruned_again.number].user_attrs == {"repeat_of": cut.number}


def test_a_worker_opening_a_study_that_has_trials_draws_afresh_not_its_first_draws_again(tmp_path):
    """A worker's sampler is seeded: a requeued worker (or a tune resumed by the same command) that seeded it as
    at its start would draw its first trials' parameters again (seen on the dev cluster: a preempted worker's next
    trial was a repeat of the one it had resumed). Its seed counts the trials the study holds."""
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import open_study, parse_space

    _, space = parse_space(["train.lr=interval(0.001, 0.1)"])
    cfg = compose(["tune.sampler=random"]).cfg
    first = open_study(cfg, tmp_path, "maximize", worker=0).ask({p.key: p.distribution() for p in space})
    again = open_study(cfg, tmp_path, worker=0).ask({p.key: p.distribution() for p in space})
    other = open_study(cfg, tmp_path, worker=1).ask({p.key: p.distribution() for p in space})
    assert len({first.params["train.lr"], again.params["train.lr"], other.params["train.lr"]}) == 3
    (tmp_path / "fresh").mkdir()
    fresh = open_study(cfg, tmp_path / "fresh", "maximize", worker=0).ask({p.key: p.distribution() for p in space})
    assert fresh.params == first.params  # (seeded: the same tune from scratch draws the same)


def test_a_draw_of_a_running_trials_parameters_is_set_aside_and_drawn_again_a_few_times_at_most(tmp_path):
    """Workers asking at once draw alike (a sampler's first draws are random): a draw of parameters another worker
    trains now is told failed, marked, and another drawn; after REDRAWS such draws the worker trains it too."""
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import REDRAWS, counts, next_trial, open_study, parse_space

    _, space = parse_space(["train.lr=choice(0.01,0.02,0.03,0.04)"])
    study = open_study(compose([]).cfg, tmp_path, "maximize")
    for lr in (0.03, 0.03, 0.04):
        study.enqueue_trial({"train.lr": lr})
    running = next_trial(study, 8, space)
    assert running.params == {"train.lr": 0.03}
    other = next_trial(study, 8, space)
    assert other.params == {"train.lr": 0.04}
    set_aside = study.get_trials()[1]
    assert (set_aside.state.name, set_aside.user_attrs) == ("FAIL", {"twin_running": running.number})
    for _ in range(REDRAWS + 1):
        study.enqueue_trial({"train.lr": 0.03})
    again = next_trial(study, 20, space)
    assert again.params == {"train.lr": 0.03} and counts(study) == {"running": 3, "redrawn": 1 + REDRAWS}


def test_trial_values_read_back_from_the_study_are_checked_against_the_tunes_own_space(tmp_path):
    """Another user who could write the study (a journal of mode 0666) appended a trial whose value is
    ``model=../../<path>/evil`` and a COMPLETE one of value 0.99 outside the space: resuming ran the first, and the
    second became best.yaml. Now a value outside the space fails its trial with one line naming the trial and the
    key, and no best.yaml is written from it."""
    import optuna

    from hpcgnn.submit.compose import compose
    from hpcgnn.submit.tune import results
    from hpcgnn.tuning import BEST, OutsideSpace, open_study, parse_space, space_overrides

    fixed, space = parse_space(["model=choice(sage,gat)", "train.lr=tag(log, interval(1e-4, 1e-2))",
                                "model.hidden_channels=range(16,65,16)"])
    assert space_overrides(space, {"model": "gat", "train.lr": 1e-3, "model.hidden_channels": 48}, 3) == \
        ["model=gat", "train.lr=0.001", "model.hidden_channels=48"]
    for params, key in [({"model": "../../x/evil", "train.lr": 1e-3, "model.hidden_channels": 16}, "model"),
                        ({"model": "sage", "train.lr": 0.5, "model.hidden_channels": 16}, "train.lr"),
                        ({"model": "sage", "train.lr": float("nan"), "model.hidden_channels": 16}, "train.lr"),
                        ({"model": "sage", "train.lr": 1e-3, "model.hidden_channels": 17}, "model.hidden_channels"),
                        ({"model": "sage", "train.lr": 1e-3}, "model.hidden_channels")]:
        with pytest.raises(OutsideSpace, match=rf"tune: trial 7: {key} = .* is outside the tune's search space "
                                               rf"\({key} in .*\): the trial fails, nothing of it runs"):
            space_overrides(space, params, 7)
    study = open_study(compose([]).cfg, tmp_path, "maximize")
    planted = optuna.trial.create_trial(params={"model": "../../x/evil", "train.lr": 1e-3, "model.hidden_channels": 16},
                                        distributions={"model": optuna.distributions.CategoricalDistribution(
                                            ["../../x/evil"]), "train.lr": space[1].distribution(),
                                            "model.hidden_channels": space[2].distribution()}, value=0.99)
    study.add_trial(planted)
    text = results(study, tmp_path, fixed, space)
    assert "best: none written: tune: trial 0: model = '../../x/evil' is outside the tune's search space" in text
    assert "rerun it" not in text and not (tmp_path / BEST).exists()


def test_a_tune_workers_crash_lands_in_its_log_whole_and_the_launcher_says_where(tmp_path):
    """A worker that crashed printed ``ValueError('I/O operation on closed file.') lost sys.stderr`` (its log file
    was closed before Python printed the traceback) and the launcher exited 1 with no line."""
    import multiprocessing

    from hpcgnn.submit.tune import _worker
    from hpcgnn.tuning import WORKERS

    (tmp_path / WORKERS).mkdir()
    (tmp_path / "tune.json").write_text("{not json")  # (a fault of the worker's: it crashes, exit 1)
    p = multiprocessing.get_context("spawn").Process(target=_worker, args=(str(tmp_path), 0, []))
    p.start()
    p.join(120)
    text = (tmp_path / WORKERS / "0.log").read_text()
    assert p.exitcode == 1 and "Traceback" in text and "JSONDecodeError" in text, text
    assert "lost sys.stderr" not in text and "closed file" not in text, text
