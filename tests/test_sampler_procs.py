"""Sampler processes per rank (train.sampler_procs): the graph shipped by reference, batches through shared
slots, training bitwise as with in-process sampling, thread budgets, and faults (no orphan, nothing in /dev/shm)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, EXAMPLES, TINY, make_config, run_cli, summary_of
from torch_geometric.data import Data, HeteroData

from hpcgnn.checks import check_thread_budget, split_threads
from hpcgnn.errors import ConfigError
from hpcgnn.sampling import shipping

# ------------------------------------------------------------------ thread budgets


def test_thread_budgets_add_up_to_the_rank_cores_and_never_exceed_them():
    assert split_threads(2, 0) == (2, 0)
    assert split_threads(2, 1) == (1, 1)
    assert split_threads(16, 12) == (4, 1)
    assert split_threads(16, 2) == (6, 5)
    assert split_threads(8, 2, per_sampler=3) == (2, 3)
    for budget, procs in ((2, 1), (3, 2), (16, 12), (16, 2), (64, 7)):
        mine, each = split_threads(budget, procs)
        assert mine >= 1 and each >= 1 and mine + procs * each <= budget
    with pytest.raises(ConfigError, match=r"train.sampler_procs=2 with 1 thread\(s\) each leaves the rank no core of "
                                          r"the 2 it has. HINT: lower train.sampler_procs"):
        split_threads(2, 2)
    with pytest.raises(ConfigError, match=r"sampler_procs=2 with 4 thread\(s\) each leaves the rank no core of the 8"):
        split_threads(8, 2, per_sampler=4)


def test_a_budget_that_leaves_a_rank_no_core_is_refused_at_submit_time():
    """Two local ranks on 2 cores have a core each: a sampler process would leave the rank none. On a cluster the
    budget is cluster.cpus_per_task; train.num_threads overrides both."""
    with pytest.raises(ConfigError, match=r"train.sampler_procs=1 with 1 thread\(s\) each leaves the rank no core of "
                                          r"the 1 it has"):
        check_thread_budget(make_config("train.sampler_procs=1", "launch.procs=2"), local_cores=2)
    check_thread_budget(make_config("train.sampler_procs=1", "launch.procs=1"), local_cores=2)
    check_thread_budget(make_config("train.sampler_procs=1", "launch.procs=2", "train.num_threads=2"), local_cores=2)
    check_thread_budget(make_config("train.sampler_procs=3", "+cluster=devcluster", "cluster.cpus_per_task=4"), 2)
    with pytest.raises(ConfigError, match=r"no core of the 1 it has"):
        check_thread_budget(make_config("train.sampler_procs=1", "+cluster=devcluster"), local_cores=64)


def test_sampler_procs_config_is_checked_at_submit_time():
    with pytest.raises(ConfigError, match=r"train.sampler_procs=-1 and train.sampler_threads=0 must be 0 or more"):
        make_config("train.sampler_procs=-1")
    with pytest.raises(ConfigError, match=r"train.sampler_procs samples on the host, and train.graph_on=device on the "
                                          r"GPU. HINT: one of train.sampler_procs=0 or train.graph_on=host"):
        make_config("train.sampler_procs=2", "train.graph_on=device", "train.device=cuda")


# ------------------------------------------------------------------ shipping: the graph by reference


def test_memory_mapped_tensors_travel_as_file_ranges_and_others_by_value(tmp_path):
    array = np.arange(1 << 20, dtype=np.float32).reshape(-1, 16)
    np.save(tmp_path / "x.npy", array)
    mapped = torch.from_numpy(np.load(tmp_path / "x.npy", mmap_mode="c"))
    view = mapped[10:20:2, 3:]  # a strided view into the mapping
    as_bf16 = mapped.view(torch.int32)[5:]  # another dtype over the same bytes
    own = torch.arange(1 << 18)  # in anonymous memory: by value
    blob = shipping.dumps({"x": mapped, "view": view, "cast": as_bf16, "own": own, "f": lambda t: t + 1})
    assert len(blob) < own.numel() * 8 + 64 * 1024  # the 4 MB mapped array is not in it; the 2 MB owned one is
    back = shipping.loads(blob)
    assert torch.equal(back["x"], mapped) and torch.equal(back["view"], view) and torch.equal(back["cast"], as_bf16)
    assert back["view"].stride() == view.stride() and torch.equal(back["own"], own)
    assert back["x"].data_ptr() != mapped.data_ptr()  # mapped again, not the same memory object
    assert torch.equal(back["f"](own[:3]), own[:3] + 1)  # closures travel by value


def test_a_batch_round_trips_through_a_slot_and_says_when_it_needs_a_larger_one():
    data = Data(x=torch.randn(50, 7), edge_index=torch.randint(0, 50, (2, 90)), y=torch.arange(50), n_id=torch.arange(50),
                batch_size=10, num_sampled_nodes=[10, 40], sample=(1.0, 2.0), mask=torch.rand(50) > 0.5,
                x16=torch.randn(50, 3).bfloat16())
    slot = torch.zeros(1 << 16, dtype=torch.uint8)
    writer = shipping.SlotWriter(slot)
    made_there = writer.alloc((50, 7), torch.float32)  # what a sampler process gathers straight into its slot
    made_there.copy_(data.x)
    data.x = made_there
    meta, used = shipping.pack(data, writer)
    back = shipping.unpack(meta, slot)
    for key in ("x", "edge_index", "y", "n_id", "mask", "x16"):
        assert torch.equal(back[key], data[key]) and back[key].dtype == data[key].dtype
        assert slot.data_ptr() <= back[key].data_ptr() < slot.data_ptr() + slot.numel()  # viewed in place
    assert back.x.data_ptr() == made_there.data_ptr()  # not copied again
    assert back.batch_size == 10 and back.num_sampled_nodes == [10, 40] and back.sample == (1.0, 2.0)
    small = torch.zeros(used - 1, dtype=torch.uint8)
    assert shipping.pack(data, shipping.SlotWriter(small)) == (None, used)
    hetero = HeteroData()
    hetero["paper"].x, hetero["paper"].batch_size = torch.randn(5, 4), 2
    hetero["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1], [2, 3]])
    back = shipping.unpack(shipping.pack(hetero, shipping.SlotWriter(slot))[0], slot)
    assert torch.equal(back["paper"].x, hetero["paper"].x) and back["paper"].batch_size == 2
    assert torch.equal(back["paper", "cites", "paper"].edge_index, hetero["paper", "cites", "paper"].edge_index)
    # a place past the slot (the description another slot's batch gave) is refused, not viewed short
    with pytest.raises(ValueError, match=r"a batch's tensor of 280 bytes at 65400 lies past its slot's 65536"):
        shipping.unpack(("Data", {"x": shipping.Ref(65400, "float32", (10, 7))}), slot)


# ------------------------------------------------------------------ the same training, bitwise

STORES = {
    "replicated": ["launch.procs=1"],
    "partitioned": ["graph=partitioned", "graph.cache_mb=0.1"],
    "typed": ["launch.procs=1", "model=custom", "model._target_=my_gnn.EdgeGINE", "+model.kwargs.edge_dim=4",
              "train.batch_size=512", "task=edge"],  # (write_rated's graph: to_hetero's GINE reads the ratings' features)
    "link": ["task=link", "launch.procs=1"],
    "cluster": ["train.sampler=cluster", "launch.procs=1"],
    "graph": ["task=graph", "dataset.num_graphs=600", "launch.procs=1", "model.hidden_channels=32", "task.layers=3",
              "train.epochs=2"],  # (whole graphs, assembled from offsets)
}


@pytest.mark.slow
@pytest.mark.parametrize("store", sorted(STORES))
def test_two_sampler_processes_train_bitwise_as_in_process_sampling(store, tmp_path):
    """Same seed, 2 epochs: parameters equal bit for bit with train.sampler_procs=2 and 0 (the rank keeps one
    thread either way: 3 cores = the rank's 1 + 2 processes of 1), and so do the partitioned exchanges' counts.
    typed: an edge task on a typed folder (its ratings the targets, left out of their batches) whose ratings carry
    features, read by a model of the user's own (each sampled edge's)."""
    over = [*TINY, *STORES[store], "metrics.tensorboard=false"]
    if store == "typed":
        from test_typed_edge_features import write_rated

        write_rated(tmp_path / "g", users=300, items=400, edge_labels=True)
        over = [*STORES[store], "dataset=files", f"dataset.path={tmp_path / 'g'}", "metrics.tensorboard=false"]
    if store == "graph":  # (a dataset of many graphs: TINY's graph settings are not its own)
        over = [*STORES[store], "metrics.tensorboard=false"]
    runs = {}
    for procs, threads in ((0, 1), (2, 3)):
        res = run_cli(*over, f"train.sampler_procs={procs}", f"train.num_threads={threads}", cwd=tmp_path / str(procs),
                      env=EXAMPLES if store == "typed" else None)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[procs] = summary_of(tmp_path / str(procs))
    assert "2 sampler process(es) started" in res.stdout
    assert runs[2]["param_checksums"] == runs[0]["param_checksums"]
    last = [r["history"][-1] for r in (runs[0], runs[2])]
    for key in ("loss", "remote_rows_per_batch", "fetched_rows_per_batch", "bytes_sent_per_batch"):
        assert last[0].get(key) == last[1].get(key), key


# ------------------------------------------------------------------ faults


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _gone(pids: list[int], shm_before: set[str], within_s: float = 15.0) -> bool:
    """Whether the processes have ended and /dev/shm holds nothing new (no slot, no named semaphore ``sem.mp-*``),
    waiting a little for the processes to end."""
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) or not _shm() <= shm_before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().split(")")[-1].split()[0] != "Z"


def _start(tmp_path: Path, *over: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "out.txt"
    child = subprocess.Popen([sys.executable, "-m", "hpcgnn", "dataset.num_nodes=20000", "train.epochs=50",
                              "train.batch_size=256", "launch.procs=1", "train.sampler_procs=1",
                              "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", f"hydra.run.dir={tmp_path / 'run'}",
                              *over], stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (a background job's is ignored)
    return child, log


def _sampler_pids(child: subprocess.Popen, log: Path) -> list[int]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and child.poll() is None:
        found = re.search(r"sampler process\(es\) started, pids ([\d ]+) ", log.read_text())
        if found:
            return [int(p) for p in found.group(1).split()]
        time.sleep(0.05)
    child.kill()
    pytest.fail(f"no sampler process started:\n{log.read_text()}")


@pytest.mark.alone  # (nothing new in /dev/shm: no other test may write there meanwhile)
@pytest.mark.slow
def test_a_killed_sampler_process_fails_its_rank_at_once_naming_it_and_leaves_nothing(tmp_path):
    before = _shm()
    child, log = _start(tmp_path)
    (pid,) = _sampler_pids(child, log)
    time.sleep(1.0)  # mid-run: most likely mid-epoch, or (epochs take a fraction of a second) between two; the
    # rank notices it waiting for a batch or sending the process its next epoch, a grant or a grown slot
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert child.wait(timeout=60) == 1, log.read_text()
    assert time.monotonic() - t0 < 30
    out = log.read_text()
    assert re.search(rf"sampler process 0 of rank 0 \(pid {pid}\) died \(signal SIGKILL\) (while the rank waited for "
                     r"batch \d+|before the rank could send it '(epoch|grant|slot)')\. HINT: SIGKILL is what the kernel's "
                     r"out-of-memory killer sends", out), out
    assert _gone([pid], before), (_shm() - before)


@pytest.mark.slow
def test_a_sampler_process_that_raises_fails_its_rank_with_its_exception(tmp_path):
    res = run_cli(*TINY, "train.num_threads=2", "train.sampler_procs=1", "debug.sampler_fail_rank=1",
                  "debug.sampler_fail_batch=1", cwd=tmp_path)
    assert res.returncode == 1
    assert re.search(r"SamplerFailed: sampler process 0 of rank 1 \(pid \d+\) failed making batch 1: RuntimeError: "
                     r"injected failure making batch 1 \(debug.sampler_fail_rank\)", res.stdout + res.stderr)


@pytest.mark.slow
def test_batches_larger_than_the_slots_grow_them_in_every_process_and_come_out_the_same(monkeypatch):
    """Slots of 4 KB: every process asks for a larger one, the rank hands the grown slot to every process (a tensor
    through the pipe), and the batches are those of the in-process loader, in order."""
    from hpcgnn.data.graph import Graph
    from hpcgnn.sampling import BatchLoader, CSRNeighborSampler
    from hpcgnn.sampling import procs as procs_module

    monkeypatch.setattr(procs_module, "SLOT_BYTES", 4096)
    gen = torch.Generator().manual_seed(0)
    n = 2000
    graph = Graph.from_edge_index(torch.randint(0, n, (2, 20 * n), generator=gen), n, torch.randn(n, 16, generator=gen),
                                  torch.randint(0, 4, (n,), generator=gen), torch.arange(n), torch.arange(0),
                                  torch.arange(0), 4)
    loader = BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, (5, 5)), torch.arange(600), 100,
                         batch_seed=3)
    pool = procs_module.SamplerPool(shipping.Recipe(graph, loader.sampler), 2, 2, 1, torch.device("cpu"), rank=0)
    try:
        pool.start()
        made = [(b.x.clone(), b.edge_index.clone(), b.n_id.clone()) for b in pool.epoch(loader.plan)]
        assert min(t.numel() for t in pool.slots) > 4096  # grown
    finally:
        pool.close(done=True)
    here = [(b.x, b.edge_index, b.n_id) for b in loader]
    assert len(made) == len(here) == 6
    for a, b in zip(made, here, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.slow
def test_a_message_to_a_sampler_process_that_has_ended_fails_the_rank_naming_it():
    """The rank's messages go through a pipe: one to a process that has ended fails the rank with the error that
    process sent before it went, or else with how it died (not a bare BrokenPipeError)."""
    import multiprocessing

    from hpcgnn.errors import SamplerFailed
    from hpcgnn.sampling import messages as m
    from hpcgnn.sampling.procs import SamplerPool, SamplerSpec, _Proc

    ctx = multiprocessing.get_context("spawn")
    pool = SamplerPool(b"", 1, 2, 1, torch.device("cpu"), rank=0)

    def ended(error: m.Failed | None) -> _Proc:
        inbox_end, inbox = ctx.Pipe(duplex=False)
        outbox, outbox_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=outbox_end.send if error else os.getpid, args=(error,) if error else ())
        p.start()
        inbox_end.close()
        outbox_end.close()
        p.join(60)
        return _Proc(SamplerSpec(0, 0, 1, False), p, inbox, outbox)

    with pytest.raises(SamplerFailed, match=r"sampler process 0 of rank 0 \(pid \d+\) died \(exit code 0\) before the "
                                            r"rank could send it 'grant'. HINT"):
        pool._send(ended(None), m.Grant(0, 0))
    with pytest.raises(SamplerFailed, match=r"sampler process 0 of rank 0 \(pid \d+\) failed making batch 3: "
                                            r"RuntimeError: boom\nits traceback:\nTraceback"):
        pool._send(ended(m.Failed(3, "RuntimeError: boom", "Traceback (most recent call last): ...")), m.Grant(3, 1))


@pytest.mark.alone  # (nothing new in /dev/shm: no other test may write there meanwhile)
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_or_ctrl_c_stops_the_samplers_leaving_no_orphan_nothing_in_dev_shm_and_no_warning(sig, tmp_path):
    """SIGTERM or Ctrl-C to a local run: the launcher stops its rank with SIGTERM, which ends it there and then (no
    clean exit); its samplers end with it, and nothing is left for multiprocessing's resource tracker to warn of (it
    did, of the queues' named semaphores: "There appear to be 6 leaked semaphore objects to clean up at shutdown")."""
    before = _shm()
    child, log = _start(tmp_path)
    pids = _sampler_pids(child, log)
    time.sleep(0.5)
    child.send_signal(getattr(signal, sig))
    assert child.wait(timeout=60) == 128 + getattr(signal, sig), log.read_text()
    assert _gone(pids, before), (_shm() - before)
    time.sleep(1.0)  # the tracker warns as its last client ends, which may be after the launcher
    assert "leaked" not in log.read_text(), log.read_text()


@pytest.mark.alone  # (nothing new in /dev/shm: no other test may write there meanwhile)
@pytest.mark.slow
def test_preempted_with_sampler_processes_resumes_exactly(tmp_path):
    """Preempted at step 5 (mid-epoch 2), resumed: the same parameters as an uninterrupted run; the samplers
    of the preempted run are gone."""
    over = [*TINY, "train.epochs=3", "launch.procs=1", "train.sampler_procs=1", "metrics.tensorboard=false"]
    before = _shm()
    cut = run_cli(*over, "debug.signal_rank=0", "debug.signal_step=5", cwd=tmp_path / "cut")
    assert cut.returncode == 3, cut.stdout + cut.stderr
    pids = [int(p) for p in re.search(r"pids ([\d ]+) ", cut.stdout).group(1).split()]
    assert _gone(pids, before), (_shm() - before)
    again = run_cli(*over, cwd=tmp_path / "cut")
    whole = run_cli(*over, cwd=tmp_path / "whole")
    assert again.returncode == 0 and whole.returncode == 0, again.stdout + again.stderr
    a, w = summary_of(tmp_path / "cut"), summary_of(tmp_path / "whole")
    assert a["resumes"] == 1 and a["param_checksums"] == w["param_checksums"]
    assert json.dumps(a["history"][-1]["loss"]) == json.dumps(w["history"][-1]["loss"])
