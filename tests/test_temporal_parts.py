"""Time on a partitioned graph: parts that carry each row's edges in time (their sources, times, places and seed
times, as the whole graph's timeline holds them), the sampler across parts drawing as of each seed's time (a remote
hop travels with its tree's time: the same edges as the whole graph's sampler, real gloo ranks), the leak detector
at chance over parts in the rank and from a sampler process, temporal link prediction and a table over parts, and
exact outputs as of a time over parts (the replicated graph's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from conftest import DATA_ROOT, local_rank_env, make_config, run_cli
from test_temporal import leak_graph, write_timed_folder

from hpcgnn.data import open_graph
from hpcgnn.errors import PartitionError
from hpcgnn.partition import ensure_parts
from hpcgnn.partition.parts import open_parts
from hpcgnn.sampling.temporal import TemporalSampler


def timed_parts_config(folder: Path, root: Path, *more: str):
    return make_config("dataset=files", f"dataset.path={folder}", f"dataset.root={root}", "graph=partitioned", *more)


def with_edge_features(folder: Path, seed: int = 1) -> None:
    """``edge_attr.npy`` beside a timed folder's edges: features that say which edge each is (its row)."""
    e = np.load(folder / "edge_index.npy").shape[1]
    rng = np.random.default_rng(seed)
    np.save(folder / "edge_attr.npy", np.stack([np.arange(e), rng.normal(size=e)], 1).astype(np.float32))


def test_a_timed_graphs_parts_carry_each_rows_edges_in_time(tmp_path):
    """Every owned row's edges in time, as the whole graph's timeline holds them: their sources and times in the same
    order, each one's place in the rank's CSR holding that edge (its source, its features), and the nodes' seed times;
    a partition written without them (an older hpcgnn) is refused naming the fix."""
    write_timed_folder(tmp_path / "g", n=1500)
    with_edge_features(tmp_path / "g")
    cfg = timed_parts_config(tmp_path / "g", tmp_path / "root", "graph.num_parts=4", "graph.method=random")
    ensure_parts(cfg.dataset, cfg.graph, 4)
    g = open_graph(cfg.dataset)
    tl = g.timeline
    for owned in ([0], [1, 2, 3]):
        parts = open_parts(cfg.dataset, cfg.graph, 4, owned)
        ptl = parts.timeline
        pos = torch.cat([torch.arange(int(g.rowptr[v]), int(g.rowptr[v + 1])) for v in parts.nodes.tolist()])
        assert torch.equal(ptl.col, tl.col[pos]) and torch.equal(ptl.time, tl.time[pos])
        assert torch.equal(parts.col[ptl.edge], tl.col[pos])  # each place holds its edge: its source ...
        assert torch.equal(parts.edge_attr[ptl.edge], g.edge_attr[tl.edge[pos]])  # ... and its features
        assert torch.equal(ptl.seed_time, tl.seed_time[parts.nodes])
    meta_path = next((tmp_path / "root").rglob("META.json"))
    meta = json.loads(meta_path.read_text())
    del meta["times"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=r"was written without its edges' times \(by an older hpcgnn\): delete it "
                                             r"and partition again\. HINT: python -m hpcgnn.partition"):
        open_parts(cfg.dataset, cfg.graph, 4, [0])


CASES = (("last", [3, 2], "last", None, False), ("all-strict-window", [1000, 1000], "uniform", 300, True),
         ("any-seeds-at-given-times", [1000, 1000], "uniform", None, True))


@contextmanager
def one_part_each(rank: int, world: int, port: int, cfg):
    """Rank ``rank`` of ``world`` gloo processes holding part ``rank``: (its parts, its exchange, its view)."""
    from hpcgnn.dist import new_group, process_group
    from hpcgnn.sampling import distributed as d

    torch.set_num_threads(1)
    with process_group(local_rank_env(rank, world, port), cfg.dist, torch.device("cpu")):
        parts = open_parts(cfg.dataset, cfg.graph, world, [rank])
        ex = d.Exchange(new_group(cfg.dist), rank, world, torch.device("cpu"), d.CommStats())
        yield parts, ex, d.PartitionView(parts, rank, 1)


def _temporal_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    from hpcgnn.sampling import distributed as d
    from hpcgnn.sampling.temporal import PartitionedTemporalSampler

    with one_part_each(rank, world, port, cfg) as (parts, ex, view):
        features = d.PartitionedFeatures(view, ex)
        out = {}
        for name, fanouts, strategy, window, strict in CASES:
            sampler = PartitionedTemporalSampler(view, fanouts, ex, edge_ids=True, strategy=strategy, window=window,
                                                 strict=strict)
            if name == "any-seeds-at-given-times":  # (a link's ends, a table's entries: any rank's, at their times)
                seeds = torch.arange(rank, parts.num_nodes, 37)
                times = torch.randint(0, 1000, (seeds.numel(),), generator=torch.Generator().manual_seed(rank))
                b = sampler.sample(seeds, torch.Generator().manual_seed(rank), times)
                features.labels = False
            else:  # (a node task's: its own nodes, at their seed times)
                seeds, times = parts.train_idx[:40], None
                b = sampler.sample(seeds, torch.Generator().manual_seed(rank))
                features.labels = True
            x, y = features.gather(b.n_id, b.batch_size)
            out[name] = {"seeds": seeds, "times": times, "n_id": b.n_id, "tree": b.tree, "edge_index": b.edge_index,
                         "edge_age": b.edge_age, "x": x, "y": y, "edge_attr": features.gather_edges(b.e_id)}
        from hpcgnn.stores.partitioned import parts_as_of

        then = parts_as_of(parts, 500)  # (predict at=T's parts: collective)
        out["as_of"] = {"nodes": parts.nodes, "rowptr": then.rowptr, "col": then.col, "degree": then.degree,
                        "edge_attr": then.edge_attr}
        torch.save(out, f"{folder}/rank{rank}.pt")


def _edges(n_id, tree, edge_index, age, rows) -> Counter:
    """A batch's edges as (tree, source, target, age, edge feature row) entries."""
    src, dst = edge_index
    return Counter(zip(tree[dst].tolist(), n_id[src].tolist(), n_id[dst].tolist(), age.tolist(), rows.tolist(),
                       strict=True))


@pytest.mark.slow
def test_the_sampler_across_parts_draws_as_of_each_seeds_time_what_the_whole_graphs_draws(tmp_path):
    """Two gloo ranks, a part each: each seed's tree over parts holds exactly the edges the whole graph's temporal
    sampler draws (the most recent k; every edge of a window strictly before the seed's time; any rank's seeds at
    given times, as a link's ends and a table's entries are), each with its age and its own features (fetched from
    the rank that holds it), and no edge after the seed's time (at it, where strict); each rank's parts as of a time
    (predict at=T's) hold the whole graph's rows as of it, every node's degree counted again."""
    from hpcgnn.submit.local import free_port

    write_timed_folder(tmp_path / "g", n=1500)
    with_edge_features(tmp_path / "g")
    cfg = timed_parts_config(tmp_path / "g", tmp_path / "root", "graph.num_parts=2")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    g, given = open_graph(cfg.dataset), torch.from_numpy(np.load(tmp_path / "g" / "edge_attr.npy"))
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(_temporal_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for name, fanouts, strategy, window, strict in CASES:
            b = got[name]
            whole = TemporalSampler(g.rowptr, g.timeline, fanouts, strategy, window, strict, edge_ids=True)
            w = whole.sample(b["seeds"], torch.Generator().manual_seed(0), b["times"])
            assert w.edge_index.size(1) > 100, name
            parts_edges = _edges(b["n_id"], b["tree"], b["edge_index"], b["edge_age"], b["edge_attr"][:, 0].long())
            assert parts_edges == _edges(w.n_id, w.tree, w.edge_index, w.edge_age, g.edge_attr[w.e_id, 0].long()), name
            assert bool((b["edge_age"] > 0).all() if strict else (b["edge_age"] >= 0).all()), name
            assert torch.equal(b["edge_attr"], given[b["edge_attr"][:, 0].long()])  # each edge's whole row
            assert torch.equal(b["x"], g.x[b["n_id"]])
            if b["times"] is None:
                assert torch.equal(b["y"], g.y[b["seeds"]])
            else:  # (seeds of both ranks)
                owned = open_parts(cfg.dataset, cfg.graph, 2, [rank]).nodes
                assert 0 < int(torch.isin(b["seeds"], owned).sum()) < b["seeds"].numel()
            assert Counter(b["n_id"].tolist()) == Counter(w.n_id.tolist())
        from hpcgnn.data.times import as_of

        then, whole = got["as_of"], as_of(g, 500)  # each rank's rows as of T: the whole graph's, every degree too
        for k, v in enumerate(then["nodes"].tolist()):
            lo, hi, a, b = int(whole.rowptr[v]), int(whole.rowptr[v + 1]), int(then["rowptr"][k]), int(then["rowptr"][k + 1])
            assert torch.equal(then["col"][a:b], whole.col[lo:hi]) and torch.equal(then["edge_attr"][a:b],
                                                                                    whole.edge_attr[lo:hi])
        assert torch.equal(then["degree"].long(), whole.degree())


@pytest.mark.slow
def test_the_leak_detector_scores_at_chance_over_parts(tmp_path):
    """The leak detector on a partitioned graph, 2 ranks: at chance in the rank and from a sampler process alike (the
    same batches: the same metrics; the sampler across parts draws what the whole graph's does, tested above)."""
    leak_graph(tmp_path / "g", n=2000)
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "train.epochs=6", "model.hidden_channels=32", "train.batch_size=256", "launch.procs=2",
              "metrics.tensorboard=false"]
    results = {}
    for name, extra in (("parts", ["graph=partitioned"]),
                        ("procs", ["graph=partitioned", "train.sampler_procs=1", "train.num_threads=2"])):
        res = run_cli(*common, *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
    parts = results["parts"]["test"]
    assert parts < 0.6, parts  # (tests/test_temporal.py: the same graph learnt with time.respect=false)
    assert results["procs"]["test"] == parts and results["procs"]["best_val"] == results["parts"]["best_val"]


@pytest.mark.slow
def test_temporal_links_and_a_table_train_over_parts(tmp_path):
    """Over two ranks' parts: link prediction in time order (historical negatives: each rank's own training links with
    their times; a hot-node cache chosen by warm-up batches of links at their times), whose embeddings as of T equal the replicated graph's bit for bit; a table's entries (each rank
    trains on its own nodes' entries and evaluates a share of any), whose predict reproduces the run's metric."""
    from test_temporal_link import event_folder, table_folder

    from hpcgnn.data import open_link

    event_folder(tmp_path / "g", n=600, e=8000)
    table_folder(tmp_path / "t")
    common = ["train.epochs=2", "launch.procs=2", "model.hidden_channels=16",
              "train.batch_size=128", "graph=partitioned", "metrics.tensorboard=false"]
    link = run_cli("dataset=files", f"dataset.path={tmp_path / 'g'}", "task=link", "task.negatives=historical",
                   "graph.cache_mb=0.1", "graph.cache_policy=frequency", *common, cwd=tmp_path / "link")
    assert link.returncode == 0, link.stderr[-3000:]
    assert "in time order (each as of its time" in link.stdout + link.stderr
    cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={DATA_ROOT}", "task=link",
                      "graph=partitioned")
    train = open_link(cfg.dataset).train  # (each rank's parts hold its sources' training links with their times)
    held = [open_parts(cfg.dataset, cfg.graph, 2, [r]) for r in range(2)]
    assert sum(p.train_pos.size(1) for p in held) == train.pos.size(1)
    for p in held:
        key = p.train_pos[0] * 600 + p.train_pos[1]
        assert bool(torch.isin(p.train_pos[0], p.nodes).all())
        mine = torch.isin(train.pos[0], p.nodes)  # (in the split's order: the same edges, each its own time)
        assert torch.equal(key, (train.pos[0] * 600 + train.pos[1])[mine]) and torch.equal(p.train_time, train.time[mine])
    table = run_cli("dataset=files", f"dataset.path={tmp_path / 't'}", "dataset.time_split=[6000,8000]", *common,
                    cwd=tmp_path / "table")
    assert table.returncode == 0, table.stderr[-3000:]
    result = json.loads((tmp_path / "table" / "run" / "summary.json").read_text())
    done = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(tmp_path / "table" / "run")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path / "table")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"test accuracy {result['test']:.4f} over 321 table entries" in done.stdout, done.stdout


TYPED_CASES = (("last", [3, 2], "last", None, False), ("all-strict-window", [1000, 1000], "uniform", 60, True),
               ("ends-at-given-times", [1000, 1000], "uniform", None, True))


def _typed_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    from hpcgnn.sampling.temporal import PartitionedTypedTemporalSampler

    with one_part_each(rank, world, port, cfg) as (parts, ex, view):
        off = parts.typed.schema.offsets()
        out = {}
        for name, fanouts, strategy, window, strict in TYPED_CASES:
            sampler = PartitionedTypedTemporalSampler(view, fanouts, ex, strategy=strategy, window=window,
                                                      strict=strict)
            if name == "ends-at-given-times":  # (an edge task's ends: papers and authors of any rank, at times)
                gen = torch.Generator().manual_seed(rank)
                seeds = {"paper": torch.randint(0, 600, (30,), generator=gen),
                         "author": torch.randint(0, 200, (30,), generator=gen)}
                times = {t: torch.randint(50, 300, (30,), generator=gen) for t in seeds}
                b = sampler.sample(seeds, torch.Generator().manual_seed(rank), times)
            else:  # (a node task's: its own papers, at their seed times)
                seeds = parts.own_of_type("paper")[:30] - off["paper"]
                times = None
                b = sampler.sample(seeds, torch.Generator().manual_seed(rank))
            out[name] = {"seeds": seeds, "times": times, "n_id": b.n_id, "tree": b.tree, "edge_index": b.edge_index,
                         "edge_age": b.edge_age}
        from hpcgnn.stores.partitioned import parts_as_of

        then = parts_as_of(parts, 150).typed  # (predict at=T's typed parts: collective)
        out["as_of"] = [(rel, parts.own_of_type(rel[2]) - off[rel[2]], then.rowptr[rel], then.col[rel])
                        for rel in then.schema.relations]
        torch.save(out, f"{folder}/typed{rank}.pt")


@pytest.mark.slow
def test_the_typed_sampler_across_parts_draws_as_of_each_seeds_time_what_the_whole_graphs_draws(tmp_path):
    """A timed typed graph over two gloo ranks' parts: every relation's hop of a remote node travels to its owner with
    its tree's time, and each tree holds exactly the edges the whole typed graph's temporal sampler draws (the most
    recent k; every edge of a window strictly before the time; an edge task's ends of any rank at given times), each
    with its age; each rank's typed parts as of a time (predict at=T's) hold the whole typed graph's rows as of it."""
    from test_temporal import typed_leak_folder

    from hpcgnn.data import open_typed
    from hpcgnn.sampling.temporal import TypedTemporalSampler
    from hpcgnn.submit.local import free_port

    typed_leak_folder(tmp_path / "g", n=600, a=200)
    cfg = timed_parts_config(tmp_path / "g", tmp_path / "root", "graph.num_parts=2")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    g = open_typed(cfg.dataset)
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(_typed_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        got = torch.load(tmp_path / f"typed{rank}.pt", weights_only=True)
        for name, fanouts, strategy, window, strict in TYPED_CASES:
            b = got[name]
            whole = TypedTemporalSampler(g, fanouts, strategy, window, strict)
            w = whole.sample(b["seeds"], torch.Generator().manual_seed(0), b["times"])

            def edges(out):
                return Counter((r, out["tree"][r[2]][d], out["n_id"][r[0]][s], out["n_id"][r[2]][d], a)
                               for r, ei in out["edge_index"].items()
                               for s, d, a in zip(*ei.tolist(), out["edge_age"][r].tolist(), strict=True))

            mine = edges({k: {t: v.tolist() for t, v in b[k].items()} for k in ("tree", "n_id")} |
                         {"edge_index": b["edge_index"], "edge_age": b["edge_age"]})
            theirs = edges({"tree": {t: v.tolist() for t, v in w.tree.items()},
                            "n_id": {t: v.tolist() for t, v in w.n_id.items()},
                            "edge_index": w.edge_index, "edge_age": w.edge_age})
            assert sum(mine.values()) > 50 and mine == theirs, name
            if strict:
                assert all(bool((a > 0).all()) for a in b["edge_age"].values()), name
        from hpcgnn.data.times import typed_as_of

        whole = typed_as_of(g, 150)  # each rank's rows of every relation as of T: the whole typed graph's
        for rel, own, rowptr, col in got["as_of"]:
            for k, v in enumerate(own.tolist()):
                lo, hi = int(whole.rowptr[rel][v]), int(whole.rowptr[rel][v + 1])
                assert torch.equal(col[int(rowptr[k]):int(rowptr[k + 1])], whole.col[rel][lo:hi]), rel
