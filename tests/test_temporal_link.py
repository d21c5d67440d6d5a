"""Temporal link prediction: a timed graph's edges split in time order (each given edge a positive at its time), the
history historical negatives come from (C and its torch twin, against a brute force), TGB's mix of negatives, the
batches of training and evaluation (no edge at or after a link's time, every end a tree of its own), a run's metrics
the same from every producer, outputs as of a time; and an edge task's targets asked at their times."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import make_config, needs_cc, run_cli
from test_temporal import timed_csr

from hpcgnn.config import dataset_config
from hpcgnn.data import build_link, open_link, prepare
from hpcgnn.data.graph import Graph
from hpcgnn.data.history import History, mixed_negatives
from hpcgnn.data.link import with_eval_negatives
from hpcgnn.data.times import timeline_of
from hpcgnn.errors import ConfigError
from hpcgnn.sampling.link import LinkSampler, pair_sampler
from hpcgnn.sampling.temporal import TemporalSampler


def event_folder(folder, n=400, e=6000, seed=0, float_times=False):
    """A files folder of timed events: pairs repeat (a pair met again later is a new event), some self-loops."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    dst[: e // 4] = (src[: e // 4] + rng.integers(0, 5, e // 4)) % n  # (repeated pairs; a few self-loops)
    t = rng.integers(0, 10_000, e)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"edge_index": np.stack([src, dst]), "edge_time": t.astype(np.float64) + 0.5 if float_times else t,
              "x": rng.normal(size=(n, 8)).astype(np.float32), "y": rng.integers(0, 2, n)}
    perm = rng.permutation(n)
    arrays.update(train_idx=perm[: n // 2], val_idx=perm[n // 2: 3 * n // 4], test_idx=perm[3 * n // 4:])
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return arrays


@pytest.mark.parametrize("undirected", [False, True])
def test_a_timed_graphs_edges_split_in_time_order_each_given_edge_a_positive(tmp_path, undirected):
    """Each edge given (an event: a pair met twice is two; never a reverse to_undirected adds, nor a self-loop) is a
    positive at its own time; training's come before validation's, validation's before test's, at the fractions of
    the edges or at given cut times; message passing keeps every edge. A PyG graph of the same arrays splits the
    same."""
    a = event_folder(tmp_path / "g")
    src, dst, t = a["edge_index"][0], a["edge_index"][1], a["edge_time"]
    base = dict(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), prepared_for="link",
                to_undirected=undirected)
    data = open_link(_prepared(dataset_config(**base)))
    assert data.timed and data.metric == "mrr" and data.graph.num_edges == src.size * (2 if undirected else 1)
    keep = src != dst
    order = np.argsort(t[keep], kind="stable")
    got = torch.cat([data.split(s).pos for s in ("train", "val", "test")], 1)
    times = torch.cat([data.split(s).time for s in ("train", "val", "test")])
    assert np.array_equal(times.numpy(), t[keep][order])
    events = sorted(zip(src[keep].tolist(), dst[keep].tolist(), t[keep].tolist(), strict=True))
    assert sorted(zip(*got.tolist(), times.tolist(), strict=True)) == events
    sizes = [data.split(s).pos.size(1) for s in ("train", "val", "test")]
    assert abs(sizes[0] / len(events) - 0.85) < 0.01 and abs(sizes[1] / len(events) - 0.05) < 0.01
    assert data.train.time.max() < data.val.time.min() and data.val.time.max() < data.test.time.min()
    cut = open_link(_prepared(dataset_config(**base, time_split=(5000, 8000))))
    assert cut.train.time.max() < 5000 <= cut.val.time.min() and cut.val.time.max() < 8000 <= cut.test.time.min()
    with pytest.raises(ConfigError, match=r"dataset.path=\S+: its \d+ edges' times leave no test edges with the cut "
                                          r"times 5000 and 20000\. HINT: dataset.edge_split"):
        prepare(dataset_config(**base, time_split=(5000, 20000)))
    if undirected:
        return
    pyg = build_link(make_config("dataset=pyg", "dataset._target_=test_temporal_link.pyg_events",
                                 f"dataset.root={tmp_path / 'root'}", "task=link").dataset)
    for s in ("train", "val", "test"):
        assert torch.equal(pyg.split(s).pos, data.split(s).pos) and torch.equal(pyg.split(s).time, data.split(s).time)
    for f in ("col", "time", "edge", "given"):
        assert torch.equal(getattr(pyg.graph.timeline, f).long(), getattr(data.graph.timeline, f).long()), f


def test_jodies_datasets_are_read_offline_from_their_raw_csv_each_event_an_edge_with_its_message(tmp_path):
    """``dataset=pyg dataset._target_=torch_geometric.datasets.JODIEDataset``: PyG reads the raw CSV it finds under
    the data root (no download), and its ``TemporalData`` is a graph of events: each ``src -> dst`` an edge at ``t``,
    ``msg`` its features, a positive of the chronological split."""
    rng = np.random.default_rng(0)
    raw = tmp_path / "root" / "pyg" / "JODIEDataset" / "mooc" / "raw"
    raw.mkdir(parents=True)
    e, users, items = 500, 60, 20
    u, i = rng.integers(0, users, e), rng.integers(0, items, e)
    t, msg = np.sort(rng.integers(0, 10_000, e)), rng.normal(size=(e, 3)).round(3)
    lines = ["user_id,item_id,timestamp,state_label,comma_separated_list_of_features"]
    lines += [f"{u[k]},{i[k]},{float(t[k])},0," + ",".join(map(str, msg[k])) for k in range(e)]
    (raw / "mooc.csv").write_text("\n".join(lines) + "\n")
    cfg = make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.JODIEDataset",
                      "+dataset.kwargs.name=mooc", f"dataset.root={tmp_path / 'root'}", "task=link").dataset
    data = open_link(_prepared(cfg))
    g, tl = data.graph, data.graph.timeline
    src, dst = u, i + int(u.max()) + 1  # (JODIE's items follow its users)
    got = torch.cat([data.split(s).pos for s in ("train", "val", "test")], 1)
    times = torch.cat([data.split(s).time for s in ("train", "val", "test")])
    assert sorted(zip(*got.tolist(), times.tolist(), strict=True)) == sorted(zip(src.tolist(), dst.tolist(),
                                                                                 t.tolist(), strict=True))
    row = torch.repeat_interleave(torch.arange(g.num_nodes), g.degree())[tl.edge]
    events = {(int(a), int(b), int(c)): k for k, (a, b, c) in enumerate(zip(src, dst, t, strict=True))}
    for pos in range(0, g.num_edges, 37):  # each edge's features: its event's message
        k = events[(int(tl.col[pos]), int(row[pos]), int(tl.time[pos]))]
        assert np.allclose(g.edge_attr[tl.edge[pos]].float().numpy(), msg[k], atol=1e-2)


def pyg_events():
    """:func:`event_folder`'s arrays as a PyG ``Data`` (``dataset._target_=test_temporal_link.pyg_events``)."""
    import tempfile
    from pathlib import Path

    from torch_geometric.data import Data

    a = event_folder(Path(tempfile.mkdtemp()) / "g")
    return Data(x=torch.from_numpy(a["x"]), edge_index=torch.from_numpy(a["edge_index"]),
                edge_time=torch.from_numpy(a["edge_time"]))


def _prepared(cfg):
    prepare(cfg)
    return cfg


def history_graph(seed=3, n=300, e=5000):
    rowptr, src, dst, time, _ = timed_csr(n, e, seed)
    tl = timeline_of(rowptr, src, time, None, torch.ones(src.numel(), dtype=torch.bool))
    empty = torch.empty(0, dtype=torch.long)
    g = Graph(rowptr, src, torch.zeros(n, 1), empty, empty, empty, empty, 0, timeline=tl)
    return g, src, dst, time


@needs_cc
def test_history_draws_distinct_destinations_each_source_met_before_on_both_paths(switch):
    """:meth:`History.met`: up to k destinations of edges from the source strictly before its time, distinct, never
    the excluded one, all of them where it met fewer; the kernels and the torch ops draw the same."""
    g, src, dst, time = history_graph()
    h = History.of_graph(g)
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(0, 300, (500,), generator=gen)
    at = torch.randint(0, 1000, (500,), generator=gen)
    exclude = torch.randint(0, 300, (500,), generator=gen)

    def drawn():
        return h.met(q, at, 6, torch.Generator().manual_seed(9), exclude)

    switch(True)
    native = drawn()
    switch(False)
    assert torch.equal(native, drawn())
    for i in range(500):
        before = set(dst[(src == q[i]) & (time < at[i])].tolist()) - {int(exclude[i])}
        row = [d for d in native[i].tolist() if d >= 0]
        assert len(row) == len(set(row)) == min(6, len(before)) and set(row) <= before, i
        assert native[i, len(row):].eq(-1).all()


def test_tgb_negatives_are_half_historical_then_random_and_seeded():
    """:func:`mixed_negatives`: the first k // 2 from the source's past where it met enough (random in the places it
    did not), the rest random among the nodes some edge reaches, never the positive; :func:`with_eval_negatives`
    draws the same every time from the dataset's seed alone."""
    g, src, dst, time = history_graph()
    h = History.of_graph(g)
    q, d = src[:400], dst[:400]
    at = time[:400] + 1
    neg = mixed_negatives(h, q, d, at, 10, torch.Generator().manual_seed(2))
    assert neg.shape == (400, 10) and bool((neg >= 0).all()) and not bool((neg == d.unsqueeze(1)).any())
    met = h.met(q, at, 5, torch.Generator().manual_seed(2), d)
    assert torch.equal(neg[:, :5][met >= 0], met[met >= 0])
    reached = set(torch.nonzero(g.degree() > 0).squeeze(1).tolist())
    assert set(neg[:, 5:].reshape(-1).tolist()) <= reached
    from hpcgnn.data.link import LinkData, LinkSplit

    split = LinkSplit(torch.stack([q, d]), None, "targets", at)
    data = LinkData(g, split, split, split, "mrr", h)
    a, b = with_eval_negatives(data, 8, 0), with_eval_negatives(data, 8, 0)
    assert torch.equal(a.val.neg, b.val.neg) and not torch.equal(a.val.neg, with_eval_negatives(data, 8, 1).val.neg)


@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("negatives", ["uniform", "historical"])
def test_a_timed_link_batch_sees_no_edge_at_or_after_its_links_time(strategy, negatives):
    """Training and evaluation batches of a chronological split: every end of every pair (negatives too) is a tree of
    its own, as of its positive's time; no sampled edge is at or after it (the positive's own edge included), each
    is an edge of the graph with its age; the pairs to score name the right nodes."""
    g, src, dst, time = history_graph(n=400, e=8000)
    h = History.of_graph(g)
    pos, t = torch.stack([src[:600], dst[:600]]), time[:600]
    node = TemporalSampler(g.rowptr, g.timeline, [6, 4], strategy, None, strict=True, edge_ids=True)
    sampler = LinkSampler(node, pos, 400, negatives, 3, times=t, history=h)
    from hpcgnn.data.link import LinkData, LinkSplit

    split = LinkSplit(pos, None, "targets", t)
    evaluated = with_eval_negatives(LinkData(g, split, split, split, "mrr", h), 5, 0).val
    gen = torch.Generator().manual_seed(0)
    for kind, out in (("train", sampler.sample(torch.arange(0, 600, 7), gen)),
                      ("eval", pair_sampler(node, evaluated).sample(torch.arange(0, 600, 11), gen))):
        tree_time = torch.cat([t[0:600:7]] * 2 + [t[0:600:7].repeat_interleave(3)]) if kind == "train" else \
            torch.cat([t[0:600:11], t[0:600:11].repeat_interleave(6)])
        assert out.batch_size == tree_time.numel()
        et = time[out.e_id]
        at = tree_time[out.tree[out.edge_index[1]]]
        assert bool((et < at).all()) and torch.equal(out.edge_age, (at - et).to(out.edge_age.dtype)), kind
        assert torch.equal(src[out.e_id], out.n_id[out.edge_index[0]]), kind
        assert torch.equal(dst[out.e_id], out.n_id[out.edge_index[1]]), kind
        pairs = out.targets["edge_label_index"]
        if kind == "train":
            b = t[0:600:7].numel()
            assert torch.equal(out.n_id[pairs[:, :b]], pos[:, 0:600:7])
        else:
            p = t[0:600:11].numel()
            ends = torch.cat([pos[1, 0:600:11].unsqueeze(1), evaluated.neg[0:600:11]], 1)
            assert torch.equal(out.n_id[pairs[0]], pos[0, 0:600:11].repeat_interleave(6))
            assert torch.equal(out.n_id[pairs[1]], ends.reshape(-1)) and pairs.size(1) == p * 6


def test_a_link_tasks_samplers_are_strict_in_the_rank_and_on_a_server_and_a_node_tasks_are_not(tmp_path):
    """The task's items say how a timed graph's seeds are sampled (a link's strictly before its time; a node's at or
    before): the store's samplers, training's and evaluation's, and a sampler server's, built as the rank's."""
    from hpcgnn.env import RankEnv
    from hpcgnn.stores.replicated import ReplicatedStore
    from hpcgnn.tasks import open_store

    event_folder(tmp_path / "g")
    np.save(tmp_path / "g" / "seed_time.npy", np.full(400, 5000))
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}"]
    for task, strict in (("link", True), ("node", False)):
        cfg = make_config(*common, f"task={task}")
        store = open_store(cfg, RankEnv.from_environ({}))
        samplers = [store.sampler, getattr(store.train_sampler, "node_sampler", store.train_sampler)]
        side, _ = ReplicatedStore.server_side(cfg, store.sampler_state(), store.graph, type(store.items))
        samplers.append(getattr(side.sampler, "node_sampler", side.sampler))
        assert [isinstance(s, TemporalSampler) and s.strict for s in samplers] == [strict] * 3, task
    # predict at=T's store: the graph as of T, for a run with historical negatives too (its timed checks run on the
    # graph as prepared, not on the untimed copy as of T, which refused them)
    then = open_store(make_config(*common, "task=link", "task.negatives=historical", "predict.at=5000"),
                      RankEnv.from_environ({}))
    assert then.graph.timeline is None and 0 < then.graph.num_edges < store.graph.num_edges


@pytest.mark.slow
def test_a_temporal_link_run_scores_the_same_from_every_producer(tmp_path):
    """task=link on a timed folder: trained and ranked as of each link's time (MRR against TGB's negatives), the same
    metrics in the rank and from a sampler server (the same batches, its sampler built from what it opened, over the
    wire; sampler processes build theirs the same way: tests/test_temporal.py's leak detector runs all three); predict
    refuses what holds only as of a time, naming at=T."""
    event_folder(tmp_path / "g", n=600, e=8000)
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "task=link", "train.epochs=2", "launch.procs=1",
              "model.hidden_channels=16", "train.batch_size=256", "task.negatives=historical",
              "metrics.tensorboard=false"]
    results = {}
    for name, extra in (("rank", []), ("servers", ["launch.sampler_servers=1"])):
        res = run_cli(*common, *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
        assert "in time order (each as of its time; validation and test against 20 negatives each" in \
            res.stdout + res.stderr
    assert results["rank"]["metric"] == "val_mrr" and 0 < results["rank"]["test"] <= 1
    assert results["servers"]["test"] == results["rank"]["test"]
    assert results["servers"]["best_val"] == results["rank"]["best_val"]
    run = tmp_path / "rank" / "run"
    predicted = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run)], capture_output=True, text=True,
                               timeout=300, cwd=run.parent)
    assert predicted.returncode == 2 and "a link model's embeddings and scores hold only as of a time. HINT: at=T" in \
        predicted.stderr, predicted.stderr[-2000:]


@pytest.mark.slow
def test_a_preempted_temporal_link_run_resumes_bitwise(tmp_path):
    """Preempted mid-epoch and resumed: the same parameters and losses as the run left alone (historical negatives
    and every tree drawn from the step's generator)."""
    from conftest import preempted_and_resumed

    event_folder(tmp_path / "g", n=500, e=6000)
    whole, again = preempted_and_resumed("dataset=files", f"dataset.path={tmp_path / 'g'}", "task=link",
                                         f"dataset.root={tmp_path / 'root'}", "train.epochs=2", "train.batch_size=256",
                                         "task.negatives=historical", "task.num_negatives=2",
                                         "model.hidden_channels=16", "metrics.tensorboard=false", step=12,
                                         folder=tmp_path)
    assert again["resumes"] == 1 and whole["resumes"] == 0
    assert again["param_checksums"] == whole["param_checksums"]
    assert [r["loss"] for r in again["history"]] == [r["loss"] for r in whole["history"]]


@pytest.mark.slow
def test_predict_at_a_time_is_an_exact_pass_over_the_edges_before_it(tmp_path):
    """``hpcgnn predict RUN at=T``: every node's embedding from the edges strictly before T alone, exactly (the
    model's own full-graph forward over them); at=T on a graph without times, or sampled, refused naming the fix;
    and without at=, a link model's outputs on a timed graph refused naming at=T."""
    from conftest import predict_here, train_here

    from hpcgnn.errors import PredictError
    from hpcgnn.models.saved import load_model
    from hpcgnn.submit.predict import compose_prediction

    a = event_folder(tmp_path / "g", n=300, e=3000)
    run = tmp_path / "run"
    train_here("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}", "task=link",
               "train.epochs=1", "train.precision=fp32", "model.hidden_channels=16", "metrics.tensorboard=false",
               run_dir=run)
    s = predict_here(run, "at=5000")
    assert s["at"] == 5000 and s["mode"] == "full" and s["rows"] == 300
    got = np.load(run / "predict" / "embeddings-all-at5000-best" / "embeddings.npy")
    before = a["edge_time"] < 5000
    model = load_model(run)
    with torch.no_grad():
        want = model.encoder(torch.from_numpy(a["x"]), torch.from_numpy(a["edge_index"][:, before]))
    assert np.allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    everything = model.encoder(torch.from_numpy(a["x"]), torch.from_numpy(a["edge_index"])).detach().numpy()
    assert not np.allclose(got, everything, rtol=1e-4, atol=1e-5)  # (the later edges change them: none was read)
    with pytest.raises(PredictError, match=r"at=5000 computes every output exactly from the edges before it; got "
                                           r"mode=sampled\. HINT: drop mode="):
        compose_prediction([str(run), "at=5000", "mode=sampled"])
    with pytest.raises(PredictError, match=r"a link model's embeddings and scores hold only as of a time\. HINT: "
                                           r"at=T"):
        compose_prediction([str(run)])
    untimed = tmp_path / "untimed"
    train_here("task=link", "dataset.num_nodes=300", f"dataset.root={tmp_path / 'root'}", "train.epochs=1",
               "metrics.tensorboard=false", run_dir=untimed)
    with pytest.raises(PredictError, match=r"at=5000: the graph's edges have no times\. HINT: drop at="):
        compose_prediction([str(untimed), "at=5000"])


def test_edge_targets_with_times_are_sampled_strictly_before_them_and_split_by_them(tmp_path):
    """``edge_label_time``: when each target edge is asked. Both ends of a target grow trees of their own strictly
    before its time (its own edge unseen: nothing left out by hand); ``dataset.time_split`` splits the targets by
    their times; targets without times on a timed graph, times on an untimed one, or of another kind, refused naming
    the fix."""
    from hpcgnn.checks import check_task_config
    from hpcgnn.data.edges import open_targets, prepare_targets
    from hpcgnn.sampling.link import EdgeTargetSampler
    from hpcgnn.submit.compose import compose

    a = event_folder(tmp_path / "g")
    rng = np.random.default_rng(1)
    m = 800
    pick = rng.integers(0, a["edge_index"].shape[1], m)
    np.save(tmp_path / "g" / "edge_label_index.npy", a["edge_index"][:, pick])
    np.save(tmp_path / "g" / "edge_label.npy", rng.integers(0, 2, m))
    np.save(tmp_path / "g" / "edge_label_time.npy", a["edge_time"][pick])
    base = dict(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), prepared_for="edge")
    cfg = _prepared(dataset_config(**base, time_split=(4000, 7000)))
    prepare_targets(cfg)
    t = open_targets(cfg)
    assert torch.equal(t.time, torch.from_numpy(a["edge_time"][pick]))
    assert bool((t.time[t.split("train")] < 4000).all()) and bool((t.time[t.split("test")] >= 7000).all())
    assert t.split("train").numel() + t.split("val").numel() + t.split("test").numel() == m
    g = open_link(_prepared(dataset_config(**{**base, "prepared_for": "link"}))).graph  # (the same events)
    node = TemporalSampler(g.rowptr, g.timeline, [6, 4], strict=True, edge_ids=True)
    sampler = EdgeTargetSampler(node, t)
    items = torch.arange(0, m, 3)
    out = sampler.sample(items, torch.Generator().manual_seed(0))
    at = torch.cat([t.time[items]] * 2)[out.tree[out.edge_index[1]]]
    by_csr = torch.empty(g.num_edges, dtype=g.timeline.time.dtype)
    by_csr[g.timeline.edge] = g.timeline.time
    et = by_csr[out.e_id]
    assert bool((et < at).all()) and torch.equal(out.edge_age, (at - et).to(out.edge_age.dtype))
    pairs = out.targets["edge_label_index"]
    assert torch.equal(out.n_id[pairs], t.index[:, items]) and out.batch_size == 2 * items.numel()
    with pytest.raises(ConfigError, match=r"its edge targets do not say when each is asked\. HINT: add "
                                          r"edge_label_time.npy \(one time per target edge, the edges' unit\), or "
                                          r"time.respect=false"):
        (tmp_path / "g" / "edge_label_time.npy").rename(tmp_path / "later.npy")
        check_task_config(compose(["dataset=files", f"dataset.path={tmp_path / 'g'}", "task=edge",
                                   f"run_dir={tmp_path / 'run'}"]).cfg)
    np.save(tmp_path / "g" / "edge_label_time.npy", np.zeros(m - 1, dtype=np.int64))
    from hpcgnn.errors import DatasetError

    with pytest.raises(DatasetError, match=r"edge_label_time.npy: shape \(799,\), expected \[800\]: one time per "
                                           r"target edge"):
        prepare_targets(_prepared(dataset_config(**base, time_split=(1, 2))))
    np.save(tmp_path / "g" / "edge_label_time.npy", np.zeros(m))
    with pytest.raises(DatasetError, match=r"the targets' times are float64 but the edges' int64: give both as "
                                           r"integers or both as floats"):
        prepare_targets(_prepared(dataset_config(**base, time_split=(1, 3))))


def table_folder(folder, n=400, e=6000, r=1500, seed=0):
    """:func:`event_folder` with a table of (node, time, label) entries: some nodes asked at several times."""
    a = event_folder(folder, n, e, seed)
    rng = np.random.default_rng(seed + 1)
    node, time = rng.integers(0, n, r), rng.integers(0, 10_000, r)
    node[:20], time[:20] = 7, np.arange(20) * 500  # (node 7 asked at twenty times)
    label = rng.integers(0, 3, r)
    for name, arr in (("table_node", node), ("table_time", time), ("table_label", label)):
        np.save(folder / f"{name}.npy", arr)
    return a, node, time, label


def test_a_tables_entries_are_each_their_node_asked_as_of_their_time(tmp_path):
    """A files folder's table of (node, time, label) entries: the node task's items are its entries, split by their
    times (dataset.time_split); an entry's seed is its node, a tree of its own drawing only edges at or before the
    entry's time (a node asked at twenty times: twenty trees), its label the entry's (not the node's); what a table
    needs refused naming the file or the fix."""
    from hpcgnn.checks import check_task_config
    from hpcgnn.env import RankEnv
    from hpcgnn.errors import DatasetError
    from hpcgnn.submit.compose import compose
    from hpcgnn.tasks import open_store
    from hpcgnn.tasks.items import TableItems

    a, node, time, label = table_folder(tmp_path / "g")
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
              "dataset.time_split=[6000,8000]"]
    store = open_store(make_config(*common), RankEnv.from_environ({}))
    items = store.items
    assert isinstance(items, TableItems) and items.table.count == 1500
    assert bool((items.table.time[items.train_ids()] < 6000).all())
    assert bool((items.table.time[items.table.split("test")] >= 8000).all())
    from hpcgnn.sampling.temporal import TableSampler

    node_sampler = store.train_sampler.node_sampler
    assert isinstance(store.train_sampler, TableSampler) and isinstance(node_sampler, TemporalSampler)
    assert not node_sampler.strict  # (an entry's label asked at its time: the edges at it may be seen)
    g = store.graph
    with_ids = TableSampler(TemporalSampler(g.rowptr, g.timeline, [6, 4], edge_ids=True), items.table)
    ids = torch.arange(0, 40)
    for sampler in (store.train_sampler, with_ids):
        out = sampler.sample(ids, torch.Generator().manual_seed(0))
        assert out.batch_size == 40 and torch.equal(out.n_id[:40], torch.from_numpy(node[:40]))
        assert torch.equal(out.targets["y"], torch.from_numpy(label[:40]))
        assert out.edge_age.numel() > 0 and bool((out.edge_age >= 0).all())
        assert len(set(out.tree[:20].tolist())) == 20  # (node 7's twenty entries: twenty trees)
    by_csr = torch.empty(g.num_edges, dtype=g.timeline.time.dtype)
    by_csr[g.timeline.edge] = g.timeline.time
    at = torch.from_numpy(time[:40])[out.tree[out.edge_index[1]]]
    assert bool((by_csr[out.e_id] <= at).all()) and torch.equal(out.edge_age, (at - by_csr[out.e_id]).float())
    check_task_config(compose([*common, f"run_dir={tmp_path / 'run'}"]).cfg)  # (no seed_time needed)
    with pytest.raises(ConfigError, match=r"gives a table of \(node, time, label\) entries, each asked as of its "
                                          r"time: its edges need times, and time.respect=true\. HINT: add "
                                          r"edge_time.npy"):
        check_task_config(compose([*common, "time.respect=false", f"run_dir={tmp_path / 'run'}"]).cfg)
    np.save(tmp_path / "g" / "table_node.npy", np.full(1500, 400))
    with pytest.raises(DatasetError, match=r"table_node.npy: node ids must lie in \[0, 400\) \(the rows of x\)"):
        open_store(make_config(*common), RankEnv.from_environ({}))
    np.save(tmp_path / "g" / "table_node.npy", node)
    with pytest.raises(DatasetError, match=r"a table's entries need a split\. HINT: dataset.time_split=\[t_val,t_test\]"
                                           r" \(by their times\), or table_train_idx, table_val_idx, table_test_idx"):
        open_store(make_config(*common[:3]), RankEnv.from_environ({}))


@pytest.mark.slow
def test_a_table_trains_the_same_from_a_sampler_server_and_predict_writes_each_entry(tmp_path):
    """A node task over a table: the same metrics in the rank and from a sampler server (the same batches); predict
    writes each test entry's prediction (entry ids), as of its time, with the run's metric."""
    from conftest import predict_here

    table_folder(tmp_path / "g")
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "dataset.time_split=[6000,8000]", "train.epochs=2",
              "launch.procs=1", "model.hidden_channels=16", "train.batch_size=128", "metrics.tensorboard=false"]
    results = {}
    for name, extra in (("rank", []), ("servers", ["launch.sampler_servers=1"])):
        res = run_cli(*common, *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
        assert "a table of 1500 (node, time, label) entries" in res.stdout + res.stderr
    assert results["servers"]["test"] == results["rank"]["test"]
    assert results["servers"]["best_val"] == results["rank"]["best_val"]
    s = predict_here(tmp_path / "rank" / "run")
    assert s["of"] == "table entries" and s["mode"] == "sampled" and s["value"] == results["rank"]["test"]
    ids = np.load(tmp_path / "rank" / "run" / "predict" / "predictions-test-best" / "ids.npy")
    times = np.load(tmp_path / "g" / "table_time.npy")
    assert ids.size == s["rows"] and bool((times[ids] >= 8000).all())
