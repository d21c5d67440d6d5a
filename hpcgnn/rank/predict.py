"""One rank's part of ``hpcgnn predict RUN_DIR`` (:mod:`hpcgnn.submit.predict`): the run's trained model on the
run's graph and mode, every node of a split written into memory-mappable arrays, each rank its own rows (no
gather onto one rank), then a manifest.

    <out>/ids.npy          int64 [n]: the nodes, ascending (a typed graph: its labelled type's own ids; an edge
                           model's predictions: the split's target edges, rows of edge_label_index, or the rows
                           of a file of pairs, which take the targets' place: hpcgnn.data.edges.pairs_as_targets)
    <out>/probs.npy        float32 [n, classes]   predictions: class probabilities (softmax of the logits); a
                           float32 [n, labels]    multi-label model's: each label's probability (sigmoid)
    <out>/labels.npy       int64 [n]              predictions: the most probable class (classification)
    <out>/values.npy       float32 [n] or [n, D]  predictions of a regression model, in the labels' own units
    <out>/embeddings.npy   float32 [n, width]     embeddings: the last hidden layer's output (a link model: the
                                                  encoder's output, the embedding its decoder scores)
    <out>/scores.npy       float32 [P]            a link model's scores (logits) of the pairs of a file (ids.npy:
                                                  0..P-1, the pairs' rows), from every node's exact embedding
    <out>/manifest.json    written last, once every array is whole: each array's dtype and shape, the model
                           file, its run and epoch, the graph, the split, the metric
    <out>/summary.json     the job's result, which the launcher prints (as a training run's)

How the outputs are computed (``predict.mode``): ``full``, exact layer-wise inference over every neighbour
(:mod:`hpcgnn.stores.exact`; a layer-wise model); ``sampled``, the evaluation batches of training (the same
seeds, so the same outputs on the same ranks); ``auto``, the run's own evaluation path, so that the metric
printed is the one ``summary.json`` reports. Embeddings of a node classifier are exact (they are a layer's
output, which only layer-wise inference gives).

Arrays are first written as ``<name>.npy.part`` (rank 0 makes each at its full size; every rank writes its
rows in place), renamed once every rank has flushed: a reader never sees a half-written array under its name.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import torch

from hpcgnn import dist, paths
from hpcgnn.config import RunConfig
from hpcgnn.data.edges import read_pairs
from hpcgnn.env import RankEnv
from hpcgnn.errors import PredictError
from hpcgnn.io import write_json
from hpcgnn.models import saved
from hpcgnn.models.custom import is_layerwise
from hpcgnn.rank.metrics import peak_memory_mb
from hpcgnn.rank.techniques import autocast, resolve_precision
from hpcgnn.specs import tasks

log = logging.getLogger(__name__)


def predict(cfg: RunConfig, env: RankEnv, device: torch.device) -> dict:
    """Infer as one rank; returns the job's summary (the same on every rank; rank 0 writes the files)."""
    from hpcgnn.tasks import build_task, open_store

    t_start = time.perf_counter()
    p = cfg.predict
    record = saved.read(p.model_file, p.trust)
    precision, _ = resolve_precision(cfg.train.precision, device)
    store = open_store(cfg, env, device)
    check_graph(record, store.shape, cfg)
    task = build_task(cfg, env, store, device)
    task.adopt(saved.target_of(record))  # (its kind and a regression's scale as trained: they say what is written)
    model = task.build_model()
    model.load_state_dict(record["state_dict"])
    model = model.to(device).eval()
    mode = inference_mode(cfg, model)
    n = store.shape.num_nodes
    pairs = read_pairs(p.pairs, (n, n)) if p.what == "scores" else None  # (a link model's)
    # an edge model's predictions are of its items (its targets, or a file's pairs in their place: split=all)
    items = store.items.predicted(p.split) if p.what != "embeddings" or store.items.embeds_items else None
    edges = items is not None
    if pairs is not None:
        ids = np.arange(pairs.shape[1], dtype=np.int64)  # (pairs: their rows)
    elif edges:
        ids = items
    else:
        ids = split_ids(cfg, p.split, store.shape.schema)
    of = f"pair(s) of {p.pairs}" if p.pairs else f"{store.items.noun if edges else 'nodes'} (split {p.split})"
    log.info("predict: %s of %d %s with %s (epoch %s), %s inference, %s", p.what, ids.size, of, p.model_file,
             record.get("epoch"), mode, precision)
    t_infer = time.perf_counter()
    with torch.no_grad(), autocast(precision, device):
        if pairs is None:
            rows, mine, labels = task.predict_rows(model, mode, p.what, p.split)
        else:
            (rows, mine), labels = _scores(task, model, pairs, env), None
    if p.pairs:  # (a file's pairs have no labels: no metric)
        labels = None
    infer_s = time.perf_counter() - t_infer
    arrays = task.prediction(p.what, rows.float())
    pos = mine.numpy() if p.split == "all" or pairs is not None else np.searchsorted(ids, mine.numpy())
    # Every row once, by one rank (never a row left unwritten, as all-zero rows would be): the ranks' rows count
    # the arrays' and sum to their positions' sum, each rank's distinct and one output to each; all ranks agree.
    local_bad = int(rows.size(0) != pos.size or np.unique(pos).size != pos.size)
    written, total, bad = dist.all_reduce_sum(torch.tensor([pos.size, int(pos.sum()), local_bad],
                                                           dtype=torch.int64)).tolist()
    if written != ids.size or total != ids.size * (ids.size - 1) // 2 or bad:
        raise RuntimeError(f"predict: the ranks computed {written} rows of {ids.size}, positions summing to {total} "
                           f"({bad} rank(s) with outputs and ids that disagree)")
    t_write = time.perf_counter()
    _write(Path(cfg.run_dir), env, ids, arrays, pos)
    write_s = time.perf_counter() - t_write
    metric = task.metric
    value = task.prediction_metric(rows, labels) if labels is not None else None  # (collective)
    widths = {"ids": [], **{k: list(v.shape[1:]) for k, v in arrays.items()}}
    summary = {
        "kind": "predict", "what": p.what, "split": p.split, "rows": int(ids.size), "mode": mode, "at": p.at,
        "of": "pairs" if p.pairs else store.items.noun if edges else "nodes",
        "metric": f"{p.split}_{metric}" if labels is not None else None, "value": value,
        "run_value": (record.get("metrics") or {}).get(f"{p.split}_{metric}"),  # the trained run's, at that epoch
        "arrays": {k: {"file": f"{k}.npy", "dtype": str(a.dtype), "shape": [int(ids.size), *widths[k]]}
                   for k, a in [("ids", ids), *arrays.items()]},
        "model_file": p.model_file, "which": record.get("which"), "epoch": record.get("epoch"),
        "model_class": record.get("class"), "trained_run": str(Path(p.model_file).resolve().parent.parent),
        "run_id": record.get("run_id"), "dataset": _graph_key(cfg), "model_dataset": record.get("dataset"),
        "precision": precision, "world_size": env.world_size,
        "peak_memory_mb": dist.all_gather_object(peak_memory_mb(device)),  # per rank (the host's peak RSS on a CPU)
        "hostnames": sorted(set(dist.all_gather_object(socket.gethostname()))),
        "inference_s": infer_s, "write_s": write_s, "wall_time_s": time.perf_counter() - t_start,
        "run_dir": cfg.run_dir,
    }
    if env.is_main:  # (the manifest last: its presence says every array is whole)
        write_json(Path(cfg.run_dir) / "summary.json", summary)
        write_json(Path(cfg.run_dir) / "manifest.json", {k: v for k, v in summary.items() if k not in (
            "kind", "hostnames", "wall_time_s", "run_dir", "of")})
    dist.all_reduce_sum(torch.zeros(1))  # the files are there before any rank (and so the launcher) ends
    if env.is_main and edges and p.pairs:  # (every rank is done with the pairs found in the graph)
        from hpcgnn.tasks.items import pairs_folder

        shutil.rmtree(pairs_folder(cfg), ignore_errors=True)
    return summary


def check_request(cfg: RunConfig, record: dict) -> None:
    """What is asked fits the model's task (at submit; ``record``: its model file's), as its spec says
    (:class:`hpcgnn.specs.tasks.PredictionSpec`): an output it gives, of every node where it gives no other (a link
    or an edge model's embeddings), the pairs of a file where it takes them (each of its nodes a node of the graph,
    a typed edge model's each end of its type), all of them."""
    p, spec = cfg.predict, tasks.SPECS[cfg.task.name].prediction
    if p.pairs:
        if spec.pairs is None:
            takers = " or ".join(s.prediction.model for s in tasks.SPECS.values() if s.prediction.pairs)
            raise PredictError(f"pairs=FILE: {spec.model} scores no pairs; {takers} does. HINT: drop pairs=")
        if p.what != spec.pairs:
            raise PredictError(f"pairs=FILE: {spec.model} gives its {spec.pairs} of a file's pairs; got what={p.what}."
                               f" HINT: drop what={p.what}, or pairs=")
        if p.split != "all":
            raise PredictError(f"pairs=FILE: {spec.model} predicts every pair of the file, not a split's; got "
                               f"split={p.split}. HINT: drop split=")
        read_pairs(p.pairs, *_ends(record))
        return
    if p.what not in spec.whats:
        owners = " or ".join(f"{s.prediction.model}'s" for s in tasks.SPECS.values()
                             if p.what in s.prediction.whats or p.what == s.prediction.pairs)
        raise PredictError(f"what={p.what} is {owners} output; {spec.model}'s are {spec.outputs}. HINT: drop "
                           f"what={p.what}" + (f" (or give pairs=FILE for its {spec.pairs})" if spec.pairs == p.what
                                                else ""))
    if p.what in spec.whole and p.split != "all":
        raise PredictError(f"{spec.model}'s {p.what} are every node's (split=all); got split={p.split}. HINT: "
                           f"--{p.what} split=all")


def _ends(record: dict) -> tuple[tuple[int, int], tuple[str, str, str] | None]:
    """The node counts of a model's pairs' two ends, and its relation (a typed edge model's: its two end types')."""
    relation, schema = record.get("relation"), record["shape"].get("schema")
    if relation and schema:
        return (schema["num_nodes"][relation[0]], schema["num_nodes"][relation[2]]), tuple(relation)
    n = record["shape"]["num_nodes"]
    return (n, n), None


def inference_mode(cfg: RunConfig, model: torch.nn.Module) -> str:
    """``predict.mode`` decided: ``auto`` is the run's own evaluation path (exact where the run evaluated
    exactly, else its sampled batches); what the task's spec gives only exactly (``PredictionSpec.exact``: a node
    classifier's embeddings, its last hidden layer's; a link model's scores of pairs) is exact."""
    from hpcgnn.checks import eval_mode
    from hpcgnn.data.prepared import timed

    p, spec = cfg.predict, tasks.SPECS[cfg.task.name].prediction
    encoder = getattr(model, "encoder", model)
    timed_graph = timed(cfg.dataset)
    if p.at is not None:  # (the graph as of a time: its edges before it, untimed; exact below)
        if not timed_graph:
            raise PredictError(f"at={p.at:g}: the graph's edges have no times. HINT: drop at=")
        if p.mode == "sampled":
            raise PredictError(f"at={p.at:g} computes every output exactly from the edges before it; got "
                               "mode=sampled. HINT: drop mode=")
        from hpcgnn.checks import has_table

        if p.what == "predictions" and has_table(cfg.dataset):
            raise PredictError(f"at={p.at:g}: a table's predictions are each entry's as of its own time. HINT: drop at= "
                               "(or --embeddings split=all: every node's as of T)")
        timed_graph = False
    timed_graph = timed_graph and cfg.time.respect
    run_mode = eval_mode(cfg, timed_graph)
    if run_mode == "whole":  # (a graph model's: every graph whole, as evaluation ran it)
        if p.mode == "full":
            raise PredictError("a graph model predicts every graph whole, as its evaluation did: there is no "
                               "layer-wise pass to run. HINT: drop mode=")
        return "whole"
    mode = p.mode if p.mode != "auto" else ("full" if run_mode == "full" or p.at is not None else "sampled")
    if p.what in spec.exact:
        mode = "full"
    if timed_graph and cfg.task.name == "link":
        raise PredictError("the graph's edges have times, and a link model's embeddings and scores hold only as of a "
                           "time. HINT: at=T (every node's, exact, from the edges before T); the run's own metrics, "
                           "each link ranked as of its time, are in its summary.json")
    if mode == "full" and timed_graph:
        raise PredictError("the graph's edges have times, and exact outputs would read every edge, those after each "
                           "node's time too. HINT: mode=sampled (each node as of its seed time), at=T (every node as "
                           "of T), or time.respect=false for outputs as of the graph's last edge")
    if mode == "full" and not (is_layerwise(encoder) or _is_mlp(encoder)):
        why = f"{saved.class_name(model)} cannot be run layer by layer (exact inference: PyG's BasicGNN interface, " \
              "num_layers and inference_per_layer)"
        if p.what == "embeddings":
            raise PredictError(f"{why}, and a node classifier's embedding is its last hidden layer's output. HINT: "
                               "build the model on torch_geometric.nn.models.basic_gnn.BasicGNN, or take the layer "
                               "you need from hpcgnn.load_model(RUN_DIR)")
        if p.what == "scores":
            raise PredictError(f"{why}, and pairs are scored from every node's exact embedding. HINT: --embeddings "
                               "(sampled), or hpcgnn.load_model(RUN_DIR) on a graph that fits in memory")
        raise PredictError(f"{why}. HINT: mode=sampled (the evaluation's sampled batches)")
    if p.what == "embeddings" and p.what in spec.exact and _is_mlp(encoder):  # (a hidden layer's: no graph's)
        raise PredictError("model=mlp reads no edges: its hidden layer is no graph embedding. HINT: embeddings of a "
                           "GNN (sage, gcn, gin, gat, rgcn, or a layer-wise model of your own)")
    return mode


def _is_mlp(model: torch.nn.Module) -> bool:
    from hpcgnn.models import MLPBaseline, TypedMLP

    return isinstance(model, (MLPBaseline, TypedMLP))


def same_graph(record: dict, cfg: RunConfig, changes: list[str] | None = None) -> bool:
    """Whether the graph is the one the model was trained on (the prepared graph's key); refused, naming the fix,
    where it is not and ``predict.allow_other_graph`` is not set (at submit, and on the rank). ``changes``: the
    dataset settings that differ from the run's own (None: not known here)."""
    theirs, ours = record.get("dataset"), _graph_key(cfg)
    if theirs != ours and not cfg.predict.allow_other_graph:
        other = "add --allow-other-graph to infer on another graph of the same widths (inductive use)"
        if changes:
            raise PredictError(f"the graph here ({ours}) is not the one the model was trained on ({theirs}): "
                               f"{'; '.join(changes)}. HINT: drop those dataset.* overrides to predict on the run's "
                               f"own graph, or {other}")
        why = ("the run's own dataset settings give it now, so the model file is another graph's (another run's, "
               "or the graph was prepared by another version of hpcgnn)") if changes is not None else ""
        raise PredictError(f"the graph here ({ours}) is not the one the model was trained on ({theirs})"
                           f"{': ' + why if why else ''}. HINT: {other}")
    return theirs == ours


def check_graph(record: dict, shape, cfg: RunConfig) -> None:
    """The graph is the one the model was trained on, or, with ``predict.allow_other_graph``, one of the same
    widths (features, classes; a typed graph's types and relations): inductive inference."""
    if same_graph(record, cfg):
        return
    s = record["shape"]
    schema = shape.schema.to_meta() if shape.schema is not None else None
    mine = {"num_features": shape.num_features, "num_classes": shape.num_classes, "schema": schema}
    want = {k: s[k] for k in mine}
    if not tasks.SPECS[cfg.task.name].kinds:  # (a task without targets reads no classes: a link model)
        mine.pop("num_classes"), want.pop("num_classes")
    if mine != want:
        diff = ", ".join(f"{k} {want[k]} (here {mine[k]})" for k in mine if mine[k] != want[k])
        raise PredictError(f"--allow-other-graph: the model was trained on a graph of other widths: {diff}. HINT: "
                           "a model reads graphs of the widths it was trained on")
    log.warning("predict: on a graph other than the model's (%s; trained on %s), as --allow-other-graph asks",
                _graph_key(cfg), record.get("dataset"))


def _graph_key(cfg: RunConfig) -> str:
    from hpcgnn.data import cache_folder

    return cache_folder(cfg.dataset).name


def split_ids(cfg: RunConfig, split: str, schema=None) -> np.ndarray:
    """The split's node ids, ascending, in the task's ids (``schema``: a typed graph's, whose ids are its labelled
    type's own), read from the prepared graph (memory-mapped; every rank reads the same): the arrays' rows."""
    from hpcgnn.data import open_graph

    g = open_graph(cfg.dataset)
    offset, n = 0, g.num_nodes
    if schema is not None:
        offset, n = schema.offsets()[schema.target], schema.num_nodes[schema.target]
    if split == "all":
        return np.arange(n, dtype=np.int64)
    return np.sort(np.asarray(getattr(g, f"{split}_idx"), dtype=np.int64) - offset)


PAIRS_CHUNK = 1 << 18  # pairs scored at a time (their embeddings fetched from their owners in one exchange)


def _scores(task, model: torch.nn.Module, pairs: np.ndarray, env: RankEnv):
    """This rank's contiguous share of the pairs: (their scores, their indices in the file), from every node's exact
    embedding (a rank fetches the rows of nodes other ranks own: as many exchanges on every rank)."""
    from hpcgnn.sampling.link import share
    from hpcgnn.tasks.prediction import exact_logged

    exact = exact_logged(task, model.encoder)
    lo, hi = share(pairs.shape[1], env.rank, env.world_size)
    rounds = int(dist.all_reduce_max(torch.tensor([math.ceil((hi - lo) / PAIRS_CHUNK)])).item())
    scores = []
    for j in range(rounds):
        a, b = min(lo + j * PAIRS_CHUNK, hi), min(lo + (j + 1) * PAIRS_CHUNK, hi)
        chunk = torch.from_numpy(np.array(pairs[:, a:b], dtype=np.int64))  # (a copy: the file is mapped read-only)
        h = exact.rows(chunk.reshape(-1)).to(next(model.parameters()).device)
        scores.append(model.score(h[:b - a], h[b - a:]).float().cpu())
    return (torch.cat(scores) if scores else torch.empty(0)), torch.arange(lo, hi)


def _write(out: Path, env: RankEnv, ids: np.ndarray, arrays: dict[str, np.ndarray], pos: np.ndarray) -> None:
    """Each array at its full size (rank 0 makes it, at the widest width any rank has: one without rows has
    none), every rank's rows written in place at ``pos`` and flushed; then renamed to its name by rank 0, once
    every rank is done. ``ids`` (ids.npy): the rows' nodes (scores: the pairs' indices in their file)."""
    widths = dist.all_gather_object({k: list(a.shape[1:]) for k, a in arrays.items()})
    if env.is_main:
        for stale in [out / "manifest.json", *out.glob("*.npy.part*")]:  # (an earlier attempt's: not this one's)
            stale.unlink(missing_ok=True)
        for name, a in arrays.items():
            width = max((tuple(w[name]) for w in widths), key=lambda w: (len(w), w))
            np.lib.format.open_memmap(out / f"{name}.npy.part", mode="w+", dtype=a.dtype,
                                      shape=(ids.size, *width)).flush()
        with os.fdopen(paths.open_nofollow(out / "ids.npy.part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644,
                                           "the prediction's ids"), "wb") as f:  # (np.save would add .npy to a name)
            np.save(f, ids)
    dist.all_reduce_sum(torch.zeros(1))  # the arrays exist
    for name, a in arrays.items():
        if a.shape[0]:
            target = np.load(out / f"{name}.npy.part", mmap_mode="r+")
            target[pos] = a
            target.flush()
            del target
    dist.all_reduce_sum(torch.zeros(1))  # every rank's rows are written
    if env.is_main:
        for name in ["ids", *arrays]:
            os.replace(out / f"{name}.npy.part", out / f"{name}.npy")
