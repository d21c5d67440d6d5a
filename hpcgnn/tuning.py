"""Tuning (``hpcgnn tune``): a search space in Hydra's sweep grammar, one Optuna study in the sweep folder, and the
trials its workers pull from it (no torch here: the launcher reads this).

- :func:`parse_space`: the overrides split into fixed ones and the search space (:class:`Param`): ``choice(a,b)``
  and comma lists, ``range(lo,hi[,step])``, ``interval(lo,hi)``, each with ``tag(log, ...)`` where it applies;
  refused, one line naming the override, where a choice is empty, an interval does not rise, or a log scale
  reaches zero;
- :func:`open_study`: the study, kept in ``<sweep>/study.journal`` (Optuna's journal file: workers on any node of a
  shared file system meet there, without a database), its sampler and pruner built alike in every process from
  ``tune.*``;
- :func:`next_trial` and :func:`finish`: what a worker does around each trial: ask (a failed trial's retry
  first), run it as a run of its own (``<sweep>/trials/<n>``), tell what it gave (its best validation value,
  pruned, or failed);
- :func:`metric_of`: the metric a study optimises and its direction, from ``tune.*`` and the task.

A trial's ranks report each evaluated epoch's metric to the study and stop when the pruner says so
(:mod:`hpcgnn.rank.pruning`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from hpcgnn.errors import ConfigError, MissingExtra
from hpcgnn.specs import tasks

STUDY_FILE = "study.journal"  # in the sweep folder: the study, as Optuna's journal
STUDY_NAME = "hpcgnn"
TRIALS = "trials"  # in the sweep folder: a run folder per trial, by its number
BEST = "best.yaml"  # in the sweep folder: the best trial's overrides (+tune.best=FILE reuses them)
SPEC = "tune.json"  # in the sweep folder: the overrides (fixed and searched) and the study's direction
WORKERS = "workers"  # in the sweep folder: each worker's log, beat and trials
RETRIES = 1  # a failed trial is tried again this often
REDRAWS = 3  # a worker draws again this often when another trains what it drew, then trains it too


def optuna():
    """Optuna, or one line naming the extra that brings it."""
    try:
        import optuna as module
    except ImportError:
        raise MissingExtra("hpcgnn tune needs Optuna. HINT: pip install 'hpcgnn[tune]' (or pip install optuna)") \
            from None
    module.logging.set_verbosity(module.logging.WARNING)
    return module


@dataclass(frozen=True)
class Param:
    """One dimension of the search space: ``key`` (a config key, or a group such as ``model``) and its values."""

    key: str
    kind: str  # choice | int | float
    choices: tuple = ()
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False

    def distribution(self):
        d = optuna().distributions
        if self.kind == "choice":
            return d.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return d.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def corners(self) -> list:
        """The values that check it composes: every choice, or both ends."""
        if self.kind == "choice":
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.kind == "int" else [self.low, self.high]

    def override(self, value) -> str:
        return f"{self.key}={value}"

    def holds(self, value) -> bool:
        """Whether ``value`` is one this dimension offers (a value read back from a study may be anyone's)."""
        if self.kind == "choice":
            return any(type(value) is type(c) and value == c for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind == "int" and not (isinstance(value, int) or float(value).is_integer()):
            return False
        if not self.low <= value <= self.high:
            return False
        if self.step:
            k = (value - self.low) / self.step
            return abs(k - round(k)) < 1e-6
        return True

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.key} in {{{', '.join(map(str, self.choices))}}}"
        return f"{self.key} in [{self.low:g}, {self.high:g}]{' (log)' if self.log else ''}" + \
            (f" step {self.step:g}" if self.step else "")


def parse_space(overrides: list[str]) -> tuple[list[str], list[Param]]:
    """(fixed overrides, the search space) of ``overrides``; a sweep that is no search space is refused."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    fixed, space = [], []
    for text in overrides:
        if re.search(r"(^|[=(,\s])choice\(\s*\)", text):
            raise ConfigError(f"tune: {text} offers no value. HINT: {text.split('=', 1)[0]}=choice(a,b)")
        try:
            (o,) = parser.parse_overrides([text])
        except HydraException as exc:
            raise ConfigError(f"tune: {text!r} is not an override Hydra reads ({str(exc).splitlines()[0]}). HINT: "
                              "KEY=VALUE, or KEY=choice(a,b), range(lo,hi), interval(lo,hi), tag(log, ...)") from None
        if not o.is_sweep_override():
            fixed.append(text)
            continue
        key, sweep = o.get_key_element(), o.value()
        log = "log" in (sweep.tags or set())
        if isinstance(sweep, ChoiceSweep):
            values = tuple(sweep.list)
            if not values:
                raise ConfigError(f"tune: {text} offers no value. HINT: {key}=choice(a,b)")
            if log:
                raise ConfigError(f"tune: {text}: a log scale is an interval's or a range's. HINT: {key}=tag(log, "
                                  "interval(lo,hi))")
            space.append(Param(key, "choice", values))
        elif isinstance(sweep, RangeSweep):
            step = sweep.step or 1
            ints = all(float(v).is_integer() for v in (sweep.start, sweep.stop, step))
            values = [sweep.start + i * step for i in range(max(0, math.ceil((sweep.stop - sweep.start) / step)))]
            if not values:
                raise ConfigError(f"tune: {text} holds no value (range(lo,hi) counts from lo up to hi, without it)")
            param = Param(key, "int" if ints else "float", (), values[0], values[-1], step, log)
            if not ints:
                param = Param(key, "choice", tuple(values))
            space.append(_checked(param, text))
        elif isinstance(sweep, IntervalSweep):
            kind = "int" if isinstance(sweep.start, int) and isinstance(sweep.end, int) else "float"
            space.append(_checked(Param(key, kind, (), float(sweep.start), float(sweep.end), None, log), text))
        else:
            raise ConfigError(f"tune: {text} is a sweep tune does not search (use choice, range or interval)")
    if not space:
        raise ConfigError("tune: no search space among the overrides. HINT: e.g. 'train.lr=tag(log, interval(1e-4, "
                          "1e-2))' 'model=choice(sage,gat)'")
    keys = [p.key for p in space]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"tune: {', '.join(twice)} searched twice. HINT: one range per key")
    return fixed, space


def _checked(p: Param, text: str) -> Param:
    if p.kind != "choice" and not p.low < p.high:
        raise ConfigError(f"tune: {text}: its low ({p.low:g}) must be below its high ({p.high:g})")
    if p.log and p.low <= 0:
        raise ConfigError(f"tune: {text}: a log scale needs values above 0 (got a low of {p.low:g}). HINT: a low "
                          "above 0, or no tag(log, ...)")
    return p


def expand_best(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """``+tune.best=FILE`` (a tune's ``best.yaml``) replaced by the overrides the file holds, first, so that the
    command's own overrides come after them and win; the file must be the user's own (it names code to run)."""
    out, given = [], []
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key != "tune.best":
            given.append(o)
            continue
        from hpcgnn import paths

        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(f"+tune.best={value}: no such file. HINT: a tune's best.yaml (its sweep folder)")
        text = paths.read_own(path, "the tune's best overrides").decode()
        out += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [*out, *given]


# ---------------------------------------------------------------------- what a study optimises

def metric_of(cfg) -> tuple[str | None, str]:
    """(``val_<name>`` the study optimises, or None: the task's own, known once it runs; the direction: minimize,
    maximize, or auto), refused where the task reports no such metric or the direction is at odds with it."""
    t = cfg.tune
    if t.metric == "auto":
        return None, t.direction
    name = t.metric.removeprefix("val_")
    known = tasks.SPECS[cfg.task.name].reports(cfg.task)
    if not t.metric.startswith("val_") or name not in known:
        raise ConfigError(f"tune.metric={t.metric}: task={cfg.task.name} reports val_{', val_'.join(known)}. HINT: "
                          "one of them, or tune.metric=auto (the task's own)")
    direction = t.direction if t.direction != "auto" else ("maximize" if tasks.higher_is_better(name) else "minimize")
    return t.metric, direction


def check(cfg) -> None:
    """``tune.*`` against itself (at submit)."""
    t = cfg.tune
    if t.trials < 1 or t.parallel < 1 or t.min_epochs < 1:
        raise ConfigError(f"tune.trials={t.trials}, tune.parallel={t.parallel} and tune.min_epochs={t.min_epochs} "
                          "must each be at least 1")
    if t.reduction_factor < 2:
        raise ConfigError(f"tune.reduction_factor={t.reduction_factor}: 1 trial in this many goes on at each rung, "
                          "so every trial would. HINT: tune.reduction_factor=3 or 4")
    if t.parallel > t.trials:
        raise ConfigError(f"tune.parallel={t.parallel} workers for tune.trials={t.trials}: some would have nothing to "
                          f"do. HINT: tune.parallel={t.trials} or fewer")
    metric_of(cfg)


# ---------------------------------------------------------------------- the study and its trials


def open_study(cfg, sweep_dir: str | Path, direction: str | None = None, worker: int = 0):
    """The study in ``<sweep>/study.journal`` (made with ``direction`` where it is not there yet), with the sampler
    and pruner of ``tune.*`` (each process builds its own: worker ``worker``'s sampler seeded from ``tune.seed``,
    its number and the trials the study holds when it opens it, so that workers asking at once draw apart, and a
    requeued worker or a resumed tune does not draw its first trials' parameters again)."""
    from hpcgnn.rng import derive_seed

    o = optuna()
    t = cfg.tune
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    def sampler(*seeded: int):
        seed = derive_seed(t.seed, "tune", worker, *seeded) % 2**32
        # constant_liar: a running trial counts as a poor one, so workers asking at once do not draw the same point
        return (o.samplers.TPESampler(seed=seed, constant_liar=True) if t.sampler == "tpe"
                else o.samplers.RandomSampler(seed=seed))

    storage = JournalStorage(JournalFileBackend(str(Path(sweep_dir) / STUDY_FILE)))
    rf = t.reduction_factor
    pruner = {"asha": lambda: o.pruners.SuccessiveHalvingPruner(min_resource=t.min_epochs, reduction_factor=rf),
              "hyperband": lambda: o.pruners.HyperbandPruner(min_resource=t.min_epochs,
                                                             max_resource=cfg.train.epochs, reduction_factor=rf),
              "median": lambda: o.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=t.min_epochs),
              "none": o.pruners.NopPruner}[t.pruner]()
    if direction is None:
        study = o.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler(), pruner=pruner)
    else:
        study = o.create_study(study_name=STUDY_NAME, storage=storage, sampler=sampler(), pruner=pruner,
                               direction=direction, load_if_exists=True)
    held = len(study.get_trials(deepcopy=False))
    if held:  # (a seed's stream starts again from its first draw: one of its own for where the study is)
        study.sampler = sampler(held)
    return study


def trial_dir(sweep_dir: str | Path, number: int) -> Path:
    return Path(sweep_dir) / TRIALS / str(number)


def counts(study) -> dict[str, int]:
    """Trials by state (complete, pruned, failed, running, waiting; redrawn: a draw set aside for its running twin,
    :func:`next_trial`)."""
    out: dict[str, int] = {}
    for tr in study.get_trials(deepcopy=False):
        state = "redrawn" if "twin_running" in tr.user_attrs else tr.state.name.lower()
        out[state] = out.get(state, 0) + 1
    return out


HEARTBEAT_S = 20.0  # a worker running a trial writes workers/<k>.beat this often ...
STALE_S = 3 * HEARTBEAT_S  # ... and a running trial whose beat is older than this lost its worker


class Heartbeat:
    """While a worker runs trial ``number``: ``workers/<k>.beat`` rewritten every :data:`HEARTBEAT_S` (a thread),
    so that other workers can tell a trial whose worker died (:func:`fail_stale`)."""

    def __init__(self, sweep_dir: str | Path, worker: int, number: int):
        import threading

        self.path = Path(sweep_dir) / "workers" / f"{worker}.beat"
        self.number, self.stop = number, threading.Event()
        self.beat()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def beat(self, preempted: bool = False) -> None:
        import os
        import socket
        import time

        from hpcgnn.io import write_json

        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {"trial": self.number, "time": time.time(), "pid": os.getpid(),
                               "host": socket.gethostname(), "preempted": preempted})

    def _run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            self.beat()

    def close(self, preempted: bool = False) -> None:
        """The trial ended (its beat gone), or was preempted: then its beat says so and stays, and no worker fails
        the trial while the requeued worker is away (it resumes it when it comes back)."""
        self.stop.set()
        self.thread.join()
        if preempted:
            self.beat(preempted=True)
        else:
            self.path.unlink(missing_ok=True)


def fail_stale(study, sweep_dir: str | Path, now: float | None = None) -> list[int]:
    """Running trials whose worker died (no beat within :data:`STALE_S`, nor a start that recent) told failed and
    tried again once (their parameters enqueued); returns their numbers. Two workers may find one at once: the
    one whose word the study takes enqueues it."""
    import time

    o = optuna()
    now = time.time() if now is None else now
    beats = {}
    for path in (Path(sweep_dir) / "workers").glob("*.beat"):
        try:
            b = json.loads(path.read_text())
            # (a preempted worker's trial waits for its requeue: never stale)
            when = math.inf if b.get("preempted") else float(b["time"])
            beats[int(b["trial"])] = max(beats.get(int(b["trial"]), 0.0), when)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    failed = []
    for t in study.get_trials(deepcopy=False, states=(o.trial.TrialState.RUNNING,)):
        started = t.datetime_start.timestamp() if t.datetime_start is not None else now
        if now - max(beats.get(t.number, 0.0), started) < STALE_S:
            continue
        try:
            study.tell(t.number, state=o.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # (another worker told it first)
            continue
        failed.append(t.number)
        tried = int(t.user_attrs.get("retry", 0))
        if tried < RETRIES:
            study.enqueue_trial(t.params, user_attrs={"retry": tried + 1, "retry_of": t.number})
    return failed


def next_trial(study, total: int, space: list[Param], sweep_dir: str | Path | None = None):
    """The next trial to run, or None when the study has ``total`` trials done or under way (a failed one's retry,
    enqueued, comes first; running trials whose worker died are failed first: :func:`fail_stale`). A trial drawing
    a finished trial's parameters is told its result (:func:`reuse`) and the next one drawn; one drawing a running
    trial's is set aside (told failed, marked ``twin_running``) and another drawn, up to :data:`REDRAWS` times."""
    if sweep_dir is not None:
        fail_stale(study, sweep_dir)
    redrawn = 0
    while True:
        c = counts(study)
        if c.get("complete", 0) + c.get("pruned", 0) + c.get("running", 0) >= total:
            return None
        trial = study.ask({p.key: p.distribution() for p in space})
        earlier = repeated(study, trial)
        if earlier is not None:
            state = reuse(study, trial, earlier)  # (the same run again: its result, not a second training)
            print(f"tune: trial {trial.number} draws the parameters of trial {earlier.number}: {state} as it was, "
                  "not trained again", flush=True)
            continue
        twin = running_twin(study, trial)
        if twin is None or redrawn >= REDRAWS:
            return trial
        redrawn += 1  # (another worker trains these parameters now: set aside, failed and marked, and draw again)
        trial.set_user_attr("twin_running", twin.number)
        study.tell(trial, state=optuna().trial.TrialState.FAIL)
        print(f"tune: trial {trial.number} draws the parameters of trial {twin.number}, which is running: drawn "
              "again", flush=True)


def repeated(study, trial):
    """The finished trial (complete or pruned) whose parameters ``trial`` draws again, or None. A run is the same
    floats every time it is given the same config (its seed included), so a repeat would train for nothing: a
    sampler over choices alone draws some twice (TPE, random), and more trials than combinations draws them all
    again. A failed trial's retry is never one (it is enqueued to run)."""
    if "retry" in trial.user_attrs:
        return None
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna().trial.TrialState.COMPLETE,
                                                                 optuna().trial.TrialState.PRUNED))
            if t.number != trial.number and t.params == trial.params]
    return min(done, key=lambda t: t.number) if done else None


def running_twin(study, trial):
    """The running trial whose parameters ``trial`` draws too (workers asking at once: a sampler's first draws
    are random, and TPE's constant liar cannot keep them apart), or None; never for a failed trial's retry."""
    if "retry" in trial.user_attrs:
        return None
    running = [t for t in study.get_trials(deepcopy=False, states=(optuna().trial.TrialState.RUNNING,))
               if t.number != trial.number and t.params == trial.params]
    return min(running, key=lambda t: t.number) if running else None


def reuse(study, trial, earlier) -> str:
    """Tell the study that ``trial`` ended as ``earlier`` did (its value, or pruned), marked ``repeat_of``;
    returns the state told. It reports no value of its own per epoch, so the pruner's rungs do not count the
    parameters twice."""
    o = optuna()
    trial.set_user_attr("repeat_of", earlier.number)
    if earlier.state == o.trial.TrialState.PRUNED:
        study.tell(trial, state=o.trial.TrialState.PRUNED)
        return "pruned"
    study.tell(trial, earlier.value)
    return "complete"


def rerun_overrides(fixed: list[str]) -> list[str]:
    """The fixed overrides a trial (or its rerun) keeps: not the tune's own (``tune.*``, the sweep folder) nor a run
    folder (each trial has its own)."""
    return [o for o in fixed if not o.lstrip("+~").startswith(("tune.", "hydra.sweep.", "hydra.run.", "run_dir="))]


def running_trial(study, number: int):
    """Trial ``number`` of the study to run again (a requeued or resumed worker's), or None where it is not running
    any more."""
    frozen = study.get_trials(deepcopy=False)[number]
    return optuna().trial.Trial(study, frozen._trial_id) if frozen.state.name == "RUNNING" else None


class OutsideSpace(ConfigError):
    """A trial's values, read back from the study, that the tune's own search space does not offer: the study's
    file may have been written by someone else. The trial fails; nothing of it is composed or run."""


def space_overrides(space: list[Param], params: dict, number: int) -> list[str]:
    """Trial ``number``'s overrides from its ``params``, each checked against the tune's own search space:
    :class:`OutsideSpace` names the trial and the key of the first value the space does not offer."""
    for p in space:
        if p.key not in params or not p.holds(params[p.key]):
            value = repr(params[p.key]) if p.key in params else "no value"
            raise OutsideSpace(f"tune: trial {number}: {p.key} = {value[:80]} is outside the tune's search space "
                               f"({p.describe()}): the trial fails, nothing of it runs. HINT: the study's file may "
                               "have been written by another user: keep the sweep folder private")
    return [p.override(params[p.key]) for p in space]


def trial_overrides(trial, space: list[Param]) -> list[str]:
    return space_overrides(space, trial.params, trial.number)


def finish(study, trial, run_dir: Path, code: int, space: list[Param], retry: bool = True) -> str:
    """Tell the study what the trial gave: its run's best validation value (complete), pruned (the run says where),
    or failed (tried again once where ``retry``, its parameters enqueued). Returns the state told."""
    o = optuna()
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    if code == 0 and summary is not None and summary.get("pruned_at"):
        study.tell(trial, state=o.trial.TrialState.PRUNED)
        return "pruned"
    value = summary.get("tune_value") if summary is not None else None
    if code == 0 and value is not None and not math.isnan(value):
        study.tell(trial, value)
        return "complete"
    study.tell(trial, state=o.trial.TrialState.FAIL)
    tried = int(trial.user_attrs.get("retry", 0)) if hasattr(trial, "user_attrs") else 0
    if retry and tried < RETRIES:
        study.enqueue_trial(trial.params, user_attrs={"retry": tried + 1, "retry_of": trial.number})
    return "failed"
