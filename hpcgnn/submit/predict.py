"""``hpcgnn predict RUN_DIR [OPTIONS] [OVERRIDES]``: a trained run's model, run on the run's graph in the run's
mode, writing every node of a split (predictions, or embeddings) as memory-mappable arrays.

    hpcgnn predict RUN_DIR                          the test split's class probabilities and labels
    hpcgnn predict RUN_DIR split=all --embeddings   every node's embedding
    hpcgnn predict RUN_DIR launch.procs=4           on 4 local ranks (+cluster=NAME: submitted, as training)
    hpcgnn predict LINK_RUN pairs=PAIRS.npy         a link model's scores of node pairs ([P, 2] or [2, P] ids)
    hpcgnn predict EDGE_RUN pairs=PAIRS.npy         an edge model's predictions of node pairs, as of its targets
    hpcgnn predict RUN_DIR at=T                     a timed graph's outputs as of time T (exact: the edges before T)

Options: which=best|last (the model file: the best validation epoch's, or the last step's), trust=true (a run
folder another user owns or may write, at any depth), split=test|val|
train|all, what=predictions|embeddings (--embeddings), mode=auto|full|sampled (auto: the run's own evaluation
path; full: exact layer-wise inference), pairs=FILE.npy (a link model: score these pairs; an edge model:
predict them), out=DIR (default RUN_DIR/predict/<what>-<split>-<which>; pairs: <what>-<file>-<which>),
--allow-other-graph (a graph other than the run's, of the same widths: inductive use), at=T (a graph whose edges
have times: every output as of T, an exact layer-wise pass over the edges before T). Any other KEY=VALUE
overrides the run's config (launch.procs, +cluster, graph.mode, dataset.root ...).

The job is composed from the run's own overrides (``RUN_DIR/.hydra/overrides.yaml``, without its ``hydra.*``
and ``debug.*`` ones) and then these, checked like a training job, and run or submitted into the output folder
(its own job folder: a run still training keeps its own). The ranks read the model file, which a run writes
whole or not at all (:mod:`hpcgnn.models.saved`), and write the arrays (:mod:`hpcgnn.rank.predict`).
"""

from __future__ import annotations

from pathlib import Path

from hpcgnn import trust
from hpcgnn.env import full_error
from hpcgnn.errors import PredictError, UserError, report

OPTIONS = ("which", "split", "what", "mode", "out", "pairs", "trust", "at")
FLAGS = {"--embeddings": ("what", "embeddings"), "--allow-other-graph": ("allow_other_graph", "true")}
# A run's overrides that a prediction job does not replay: its own folder (run_dir= would outrank the job's, which
# would write over the run's summary) and settings, and sampler servers (they make training batches; a prediction
# job's ranks never connect, and its launcher would wait for them to give up).
DROPPED = ("hydra.", "run_dir=", "debug.", "predict.", "launch.sampler_servers", "cluster.samplers.")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    try:
        return predict(argv)
    except UserError as exc:
        return report(exc, full_error())


def parse(argv: list[str]) -> tuple[Path, dict[str, str], list[str]]:
    """(the run folder, the options given, the other overrides)."""
    run, rest = Path(argv[0]).expanduser(), argv[1:]
    options, overrides = {"which": "best", "mode": "auto"}, []
    for arg in rest:
        key, eq, value = arg.partition("=")
        if arg in FLAGS:
            options[FLAGS[arg][0]] = FLAGS[arg][1]
        elif arg.startswith("-"):
            raise PredictError(f"unknown option {arg!r}: hpcgnn predict takes {', '.join(FLAGS)}, "
                               f"{'=, '.join(OPTIONS)}= and KEY=VALUE overrides")
        elif eq and key in OPTIONS:
            options[key] = value
        else:
            overrides.append(arg)
    return run, options, overrides


def quoted(path: Path) -> str:
    """A path as a Hydra override's value, quoted: a folder may be named with '=', ',' or spaces (a sweep member's)."""
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_overrides(run: Path) -> list[str]:
    """The overrides the run was composed from (its own record), but for those a prediction job sets itself."""
    from omegaconf import OmegaConf

    record = run / ".hydra" / "overrides.yaml"
    if not (run / ".hydra" / "config.yaml").is_file() or not record.is_file():
        raise PredictError(f"{run} is not a run folder of hpcgnn (no .hydra/config.yaml and overrides.yaml). HINT: "
                           "give the output folder a training run printed (hpcgnn status lists a sweep's)")
    given = OmegaConf.to_container(OmegaConf.load(record))
    return [o for o in given if not o.lstrip("+~").startswith(DROPPED)]


def predict(argv: list[str]) -> int:
    from hpcgnn.submit.launch import launch

    composed = compose_prediction(argv)
    return launch(composed.cfg, composed.overrides)


def compose_prediction(argv: list[str]):
    """The prediction job of ``hpcgnn predict ARGV``, composed and checked (a
    :class:`~hpcgnn.submit.compose.Composed`)."""
    from hpcgnn.models.saved import WHICH, model_path, read
    from hpcgnn.specs import tasks
    from hpcgnn.submit.compose import compose

    run, o, overrides = parse(argv)
    if o["which"] not in WHICH:
        raise PredictError(f"which={o['which']}: a run keeps {' and '.join(WHICH)}")
    if o.get("trust", "false") not in ("true", "false"):
        raise PredictError(f"trust={o['trust']}: true or false")
    trusted = o.get("trust") == "true"
    if not trusted:  # (its overrides are replayed, its model file read: another user's could run code as you)
        trust.run_folder(run, "copy the run into a folder of your own, or give trust=true if you trust whoever wrote "
                              "it")
    replay = run_overrides(run)
    path = model_path(run, o["which"])
    record = read(path, trusted)  # (a run without it, or a file that is not hpcgnn's: one line naming it)
    spec = tasks.SPECS[record["task"]].prediction  # (what its model gives: its spec says)
    what = (spec.pairs or spec.whats[0]) if "pairs" in o else spec.whats[0]
    every = "pairs" in o or o.get("what", what) in spec.whole  # (all: every node's, every pair's)
    o = {"what": what, "split": "all" if every else "test", **o}
    name = f"{o['what']}-{Path(o['pairs']).stem}" if "pairs" in o else f"{o['what']}-{o['split']}"
    if "at" in o:
        name += f"-at{o['at']}"
    out = Path(o.get("out") or run / "predict" / f"{name}-{o['which']}").expanduser().resolve()
    if out == run.resolve():
        raise PredictError(f"out={out} is the run's own folder: a prediction job writes a folder of its own. HINT: "
                           "leave out= out (RUN_DIR/predict/...) or name another folder")
    composed = compose([*replay, *overrides, f"predict.model_file={quoted(path.resolve())}",
                        f"predict.what={o['what']}", f"predict.split={o['split']}", f"predict.mode={o['mode']}",
                        f"predict.allow_other_graph={o.get('allow_other_graph', 'false')}",
                        f"predict.trust={'true' if trusted else 'false'}",
                        f"hydra.run.dir={quoted(out)}",
                        *([f"predict.pairs={quoted(Path(o['pairs']).expanduser().resolve())}"] if "pairs" in o else []),
                        *([f"predict.at={o['at']}"] if "at" in o else [])])
    from hpcgnn.rank.predict import check_request, inference_mode, same_graph

    check_request(composed.cfg, record)
    p = composed.cfg.predict
    if p.mode != "sampled" or p.what != "predictions":  # exact, where the model can run layer by layer: known here
        from hpcgnn.models.saved import rebuild

        inference_mode(composed.cfg, rebuild(record))
    same_graph(record, composed.cfg, dataset_changes(run, composed.cfg))
    return composed


def dataset_changes(run: Path, cfg) -> list[str]:
    """The dataset settings of ``cfg`` that differ from those the run trained with (its .hydra/config.yaml)."""
    import dataclasses

    from omegaconf import OmegaConf

    try:
        then = OmegaConf.to_container(OmegaConf.load(run / ".hydra" / "config.yaml")).get("dataset") or {}
    except (OSError, ValueError, AttributeError):
        return []
    now = dataclasses.asdict(cfg.dataset)
    same = lambda a, b: a == b or (isinstance(a, (list, tuple)) and list(a) == list(b))  # noqa: E731
    return [f"dataset.{k}={now[k]!r} (the run's: {then[k]!r})" for k in sorted(now)
            if k in then and k not in ("root", "trust_root", "prepared_for") and not same(now[k], then[k])]
