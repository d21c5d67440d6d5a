"""Shared helpers: compose a RunConfig like the CLI does, and run the CLI itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpcgnn.config import RunConfig
from hpcgnn.submit.compose import compose

REPO = Path(__file__).resolve().parent.parent
# Test accuracy the default job must reach, wherever it runs (local processes or SLURM).
ACCURACY_BAR = 0.85
# Prepared datasets of this test session (shared by its runs, and by pytest-xdist's workers, which inherit the
# variable from the process that made the folder; removed at the end by that process; never ~/.cache).
_MADE_DATA_ROOT = not os.environ.get("HPCGNN_TEST_DATA_ROOT")
DATA_ROOT = Path(os.environ.get("HPCGNN_TEST_DATA_ROOT") or tempfile.mkdtemp(prefix="hpcgnn-test-data-"))
os.environ["HPCGNN_TEST_DATA_ROOT"] = str(DATA_ROOT)


def pytest_sessionfinish(session):
    if _MADE_DATA_ROOT:
        shutil.rmtree(DATA_ROOT, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--phase", choices=("all", "shared", "alone"), default="all",
                     help="shared: the tests that may run beside others (pytest-xdist's workers); alone: those marked "
                          "alone, which look at what the whole machine holds; all: both (make test runs the two)")


def pytest_collection_modifyitems(config, items):
    """``--phase`` keeps its tests; the tests on the SLURM dev cluster go to one pytest-xdist worker, one after
    another (its two nodes are the cluster's)."""
    phase = config.getoption("--phase")
    if phase != "all":
        alone = phase == "alone"
        config.hook.pytest_deselected(items=[item for item in items
                                             if (item.get_closest_marker("alone") is not None) != alone])
        items[:] = [item for item in items if (item.get_closest_marker("alone") is not None) == alone]
    for item in items:
        if item.get_closest_marker("slurm") is not None or "devcluster_up" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))


# The two kinds of CPU users have, as HPCGNN_CPU_FLAGS (hpcgnn.env.cpu_flags) makes hpcgnn see them: what
# train.precision=auto picks on each. The tests that compare computation paths take the `cpu_kind` fixture and
# run both ways on whichever machine runs the suite.
CPU_KINDS = {"avx2": ("fpu sse avx avx2 fma", "fp32"),
             "avx512_bf16": ("fpu sse avx avx2 fma avx512f avx512bw avx512_bf16", "bf16")}


@pytest.fixture(params=sorted(CPU_KINDS))
def cpu_kind(request, monkeypatch) -> str:
    """Run the test as if on each kind of CPU (processes it starts inherit it); the precision auto picks there."""
    flags, precision = CPU_KINDS[request.param]
    monkeypatch.setenv("HPCGNN_CPU_FLAGS", flags)
    return precision


# Unit roundoff of each precision's compute type (half an ulp at 1.0): fp32 2^-24, bf16 2^-8 (8 significant bits).
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8}


def make_config(*overrides: str, run_dir: str = "/tmp/hpcgnn-test-run") -> RunConfig:
    """Compose the packaged configs with ``overrides``, on the path every hpcgnn command takes."""
    return compose([*overrides, f"run_dir={run_dir}"]).cfg


def local_rank_env(rank: int, world: int, port: int):
    """The RankEnv of rank ``rank`` of ``world`` processes on this host meeting at 127.0.0.1:``port``."""
    from hpcgnn.env import RankEnv

    return RankEnv.from_environ({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                                 "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def exact_inference_worker(rank: int, world: int, port: int, cfg, folder: str, models: tuple[str, ...]) -> None:
    """One of ``world`` gloo ranks on a partitioned graph: for each model (untrained, seeded), its exact
    layer-wise logits of its own nodes and the node task's exact evaluation (twice: the second reads what the
    first made of the rank's edges, kept by the store), saved with the ids of those
    nodes (a typed graph: its own target-type nodes, in target-type ids). Tiny slices: every path takes
    several exchanges, slices and chunks."""
    import dataclasses

    import torch

    from hpcgnn.dist import process_group
    from hpcgnn.models import build_node_model, gcn_norm
    from hpcgnn.stores import exact as ex
    from hpcgnn.tasks import build_task, open_store

    torch.set_num_threads(1)
    ex.FETCH_ROWS, ex.SLICE_EDGES = 97, 1000
    env, cpu = local_rank_env(rank, world, port), torch.device("cpu")
    out = {}
    with process_group(env, cfg.dist, cpu):
        store = open_store(cfg, env)
        parts, g = store.parts, store.shape.schema
        for name in models:
            ex.INTERIOR_FIRST = 0.0 if name != "sage, in row order" else 2.0  # (reordered, or never)
            model_cfg = dataclasses.replace(cfg.model, name=name.split(",")[0], hidden_channels=16)
            torch.manual_seed(0)
            model = build_node_model(model_cfg, store.shape, 2)
            pieces = (ex.TypedPartsPieces(parts, store.view, store.exchange, cpu, 300) if g is not None else
                      ex.PartsPieces(parts, store.view, store.exchange, cpu, 300,
                                     gcn_norm(model_cfg)))
            task = build_task(dataclasses.replace(cfg, model=model_cfg), env, store, cpu)
            acc = task.evaluate(model)
            kept = dict(store.layouts)  # (what the evaluation made of the rank's edges, which the next one reads)
            again = task.evaluate(model)
            out[name] = {"logits": ex.exact_outputs(model, pieces), "acc": acc, "again": again,
                         "kept": bool(kept) and all(store.layouts[k] is v for k, v in kept.items()),
                         "inner": getattr(pieces, "inner", None)}
        out["nodes"] = parts.nodes
        if g is not None:
            out["nodes"] = parts.own_of_type(g.target) - g.offsets()[g.target]
    torch.save(out, f"{folder}/rank{rank}.pt")


def check_exact_inference(ranks: list[dict], name: str, whole, y, splits: dict) -> None:
    """The ranks' logits (:func:`exact_inference_worker`) are ``whole``'s rows of their nodes, and their
    accuracies on each split (``splits``: name -> ids) the whole graph's."""
    import torch

    for r in ranks:
        assert torch.allclose(r[name]["logits"], whole[r["nodes"]], atol=1e-5), name
        # an evaluation again reads the edges in local ids the first one made, and gives the same
        assert r[name]["again"] == r[name]["acc"] and (r[name]["kept"] or name == "mlp"), name
    pred = whole.argmax(-1)
    for split, idx in splits.items():
        want = (pred[idx] == y[idx]).double().mean().item()
        assert ranks[0][name]["acc"][f"{split}_acc"] == ranks[1][name]["acc"][f"{split}_acc"]
        # untrained logits nearly tie: float noise at 1e-7 may flip one argmax
        assert ranks[0][name]["acc"][f"{split}_acc"] == pytest.approx(want, abs=1.5 / idx.numel()), (name, split)


def dead_pid() -> int:
    """The pid of a process that has exited (a killed writer's, in a leftover's name)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def start_and_stop(args: list[str], started, signum: int, cwd: Path | None = None):
    """Run ``python <args>`` until ``started()`` is true, then send ``signum``; the finished process."""
    import signal

    # SIGINT as in a terminal, even where this test process was started with it ignored (a background job)
    child = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             cwd=cwd, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not started() and child.poll() is None:
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail(f"{args} never reached the point to stop it at")
        time.sleep(0.02)
    child.send_signal(signum)
    child.wait(timeout=120)
    return child


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m hpcgnn ARGS`` in a subprocess whose run folder is ``cwd/run``."""
    cwd.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpcgnn", *args, f"dataset.root={DATA_ROOT}",
                           f"hydra.run.dir={cwd / 'run'}"],
                          cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


# A child's environment in which examples/ (the models of a user's own) imports.
EXAMPLES = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "examples"), os.environ.get("PYTHONPATH")]))}

# A graph and schedule small enough for a multi-process run in seconds.
TINY = ["dataset.num_nodes=4000", "train.epochs=2", "train.batch_size=256", "model.hidden_channels=32"]


@pytest.fixture
def tiny_overrides() -> list[str]:
    return list(TINY)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """One small 2-rank run (TINY, 3 epochs) that several tests read: its folder (holding run/)."""
    folder = tmp_path_factory.mktemp("tiny")
    res = run_cli(*TINY, "train.epochs=3", cwd=folder, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return folder


@pytest.fixture(scope="session")
def local_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`python -m hpcgnn -m model=sage,mlp` without a cluster: two members run here, one after another."""
    folder = tmp_path_factory.mktemp("local-sweep")
    res = subprocess.run([sys.executable, "-m", "hpcgnn", "-m", "model=sage,mlp", *TINY, f"dataset.root={DATA_ROOT}",
                          f"hydra.sweep.dir={folder / 'sweep'}"], cwd=folder, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    return folder / "sweep", res


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "run" / "summary.json").read_text())


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """`python -m hpcgnn` exactly as a user types it: the embedded default, 2 local processes."""
    folder = tmp_path_factory.mktemp("default")
    res = run_cli(cwd=folder, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return folder, res


def devcluster_state() -> str | None:
    """None when the SLURM dev cluster's two nodes answer; otherwise what is wrong."""
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set"
    if shutil.which("sbatch") is None:
        return "sbatch is not installed"
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    if out.returncode != 0 or sorted(states) != ["n1", "n2"]:
        return f"sinfo: {out.stdout.strip() or out.stderr.strip()}"
    bad = {n: s for n, s in states.items() if s.rstrip("*") not in ("idle", "mix", "alloc")}
    return f"nodes not up: {bad}" if bad else None


@pytest.fixture(scope="session")
def devcluster_up():
    """The SLURM dev cluster (slurm/devcluster): skip without it, fail in CI where it must be up."""
    problem = devcluster_state()
    if problem:
        hint = 'start it with: eval "$(slurm/devcluster/start.sh)" (after slurm/devcluster/install.sh)'
        if os.environ.get("CI"):
            pytest.fail(f"the SLURM dev cluster is not running in CI ({problem}); {hint}")
        pytest.skip(f"SLURM dev cluster not running ({problem}); {hint}")


def train_here(*overrides: str, run_dir) -> dict:
    """One rank trained in this process (no launcher, no process group): the run's summary. A preemption
    (``debug.signal_*``) raises :class:`hpcgnn.rank.checkpoint.Preempted` after its checkpoint, as a rank would."""
    import torch

    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer
    from hpcgnn.submit.launch import record_config

    cfg = make_config(*overrides, run_dir=str(run_dir))
    record_config(cfg, overrides)  # (as the launcher does: hpcgnn predict composes from it)
    return Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()


def preempted_and_resumed(*overrides: str, step: int, folder) -> tuple[dict, dict]:
    """One rank in this process: the run left alone (``folder/whole``), and the same run preempted at ``step`` (its
    checkpoint saved, :class:`~hpcgnn.rank.checkpoint.Preempted` raised) then resumed (``folder/cut``): both
    summaries."""
    from hpcgnn.rank.checkpoint import Preempted

    whole = train_here(*overrides, run_dir=folder / "whole")
    cut = [*overrides, "debug.signal_rank=0", f"debug.signal_step={step}"]
    with pytest.raises(Preempted, match=f"preempted: checkpoint of step {step} saved in"):
        train_here(*cut, run_dir=folder / "cut")
    return whole, train_here(*cut, run_dir=folder / "cut")


def predict_here(run_dir, *args: str, device: str = "cpu") -> dict:
    """``hpcgnn predict RUN_DIR ARGS`` as one rank in this process (on ``device``): the prediction job's summary."""
    import torch

    from hpcgnn.env import RankEnv
    from hpcgnn.rank.predict import predict
    from hpcgnn.submit.predict import compose_prediction

    cfg = compose_prediction([str(run_dir), *args]).cfg
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    return predict(cfg, RankEnv.from_environ({}), torch.device(device))


def train_batches(store, epoch: int = 1, transform=None):
    """A store's training batches of ``epoch``, made as a rank makes them itself (the producer ``InRank``, with
    the run's prefetch): the store's plan of the epoch walked over its graph side."""
    from hpcgnn.sampling.loader import InRank

    graph = store.graph_side()
    return InRank(graph.features, graph.sampler, transform, store.device, store.cfg.train.prefetch).epoch(
        store.train_plan(epoch))


def free_port() -> int:
    """A TCP port free on loopback now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Marker:
    """Unpickling this creates ``path``: what an outsider's pickle would do to whoever loads it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def one_line(res: subprocess.CompletedProcess, kind: str) -> str:
    """The one line a command printed for a user error of ``kind`` (and no traceback)."""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpcgnn: {kind}: ") and "Traceback" not in res.stdout, res.stderr
    return lines[0]


def squat(port: int, handle, stop) -> None:
    """Another user's process listening on loopback ``port`` (first: it holds the port), handing each connection
    to ``handle(conn)`` in its thread until ``stop`` (a threading.Event) is set."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(0.2)

    def run():
        with listener:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                handle(conn)

    threading.Thread(target=run, daemon=True).start()


# The C kernels built here (tests that compare them with their torch twins), and a switch between the two paths.
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here: the kernels cannot be built")


@pytest.fixture
def switch(monkeypatch):
    """``switch(on)``: the kernels on (where they build) or off (HPCGNN_NATIVE=0, torch ops only)."""
    from hpcgnn.kernels import binding

    def set_native(on: bool) -> None:
        if on:
            monkeypatch.delenv("HPCGNN_NATIVE", raising=False)
        else:
            monkeypatch.setenv("HPCGNN_NATIVE", "0")
        binding.kernels.cache_clear()
        assert (binding.kernels() is not None) == on

    yield set_native
    monkeypatch.delenv("HPCGNN_NATIVE", raising=False)
    binding.kernels.cache_clear()
