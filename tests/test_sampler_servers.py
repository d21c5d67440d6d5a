"""Sampler servers: discovery from SLURM's heterogeneous-job variables, the heterogeneous script, local
servers training bitwise as in-process sampling, and a server's death failing the run, naming it. The dev
cluster's cases (a trainer on n1, a server on n2) are in tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import DATA_ROOT, EXAMPLES, REPO, TINY, make_config, run_cli, summary_of

from hpcgnn import env, nodes
from hpcgnn.errors import ConfigError

GOLDEN = REPO / "tests" / "golden" / "slurm"


def _recorded(name: str) -> dict[str, str]:
    """A step's SLURM_* variables as a real heterogeneous job on the dev cluster had them."""
    return dict(line.split("=", 1) for line in (GOLDEN / name).read_text().splitlines() if "=" in line)


def test_trainers_find_the_servers_from_the_heterogeneous_jobs_own_variables():
    trainer = _recorded("het-group0-step.env")  # group 0 (n1) of job 46508612; group 1 (n2) is 46508613
    server = _recorded("het-group1-step.env")
    port = nodes.server_port("46508612", 0)
    assert env.sampler_servers(trainer) == [("n2", port)]
    assert env.this_server(server) == (0, port)  # the server listens where the trainers look
    assert env.RankEnv.from_environ(trainer).sampler_servers == (("n2", port),)
    assert port != nodes.derive_port("46508612")  # not the trainers' master port
    wide = {**trainer, "SLURM_JOB_NODELIST_HET_GROUP_1": "s[07-08]", "SLURM_TASKS_PER_NODE_HET_GROUP_1": "2(x2)"}
    assert env.sampler_servers(wide) == [("s07", port), ("s07", port + 1), ("s08", port), ("s08", port + 1)]
    assert env.sampler_servers({k: v for k, v in trainer.items() if "HET" not in k}) == []  # a plain job: none
    assert env.sampler_servers({"HPCGNN_SAMPLER_SERVERS": "127.0.0.1:2001,h:2002"}) == [("127.0.0.1", 2001),
                                                                                      ("h", 2002)]


def test_the_dry_run_prints_the_heterogeneous_script(tmp_path):
    res = run_cli("+cluster=devcluster", "cluster.nodes=1", "cluster.samplers.nodes=2", "cluster.samplers.cpus_per_task=3",
                  "launch.dry_run=true", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    script = res.stdout.split("# resolved config")[0]
    head = script.split("#SBATCH hetjob")
    assert len(head) == 2 and "--nodes=1" in head[0] and "--signal=USR2@30" in head[0]
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=3" in head[1]
    servers = re.search(r"^srun --het-group=1 .* -u -m hpcgnn.rank.server \S+sampler-servers.json &$", script, re.M)
    trainers = re.search(r"^srun --het-group=0 .* -m submitit.core._submit \S+$", script, re.M)
    assert servers and trainers and servers.start() < trainers.start()
    assert script.rstrip().endswith('kill "$HPCGNN_SERVERS" 2>/dev/null\nwait\nexit "$status"')


def test_sampler_nodes_are_checked_at_submit_time():
    with pytest.raises(ConfigError, match=r"cluster.samplers.nodes needs cluster.executor=slurm .* HINT: without "
                                          r"SLURM, launch.sampler_servers=N runs servers on this machine"):
        make_config("+cluster=local", "cluster.samplers.nodes=1")
    with pytest.raises(ConfigError, match=r"cluster.samplers: nodes must be 0 \(none\) or more, tasks_per_node at "
                                          r"least 1"):
        make_config("+cluster=devcluster", "cluster.samplers.tasks_per_node=0")


@pytest.mark.slow
@pytest.mark.parametrize("store", ["link", "typed", "partitioned", "custom", "edge", "graph"])
def test_local_sampler_servers_train_bitwise_as_in_process_sampling(store, tmp_path):
    """2 ranks, 2 servers: the same parameters as in-process sampling. A whole graph: each rank's batches alternate
    between the servers; a partitioned one: server r makes rank r's batches, sampling across parts with the
    other server (and the exchange counts reach the rank); edge: an edge task's targets (task=edge). custom: the
    replicated graph with a model of the user's own, with autocast to bf16 and two micro-batches per step
    (hpcgnn's own sage with a server: test_slurm's heterogeneous job and test_trust_handshake's run among
    outsiders, both against in-process sampling); typed: a partitioned typed graph, a relational model of the
    user's own reading one relation's edge features (each sampled edge's, per relation, remote ones fetched); graph: a
    graph task's whole graphs, assembled on the servers from the graph set each maps."""
    from test_typed_edge_features import write_rated

    if store == "typed":
        write_rated(tmp_path / "g", users=300, items=400)
    over = {"link": [*TINY, "task=link"],
            "typed": ["dataset=files", f"dataset.path={tmp_path / 'g'}", "model=custom", "graph=partitioned",
                      "model._target_=my_gnn.HeteroEdgeSAGE", "train.epochs=2", "train.batch_size=64"],
            "partitioned": [*TINY, "graph=partitioned", "graph.cache_mb=0.1"],
            "edge": [*TINY, "task=edge", "dataset.num_nodes=8000"],
            "graph": ["task=graph", "dataset.num_graphs=600", "model.hidden_channels=32", "task.layers=3",
                      "train.epochs=2"],
            "custom": [*TINY, "model=custom", "model._target_=my_gnn.ResidualSAGE", "train.precision=bf16",
                       "train.accumulate=2"]}[store]
    runs = {}
    for servers in (0, 2):
        res = run_cli(*over, "train.num_threads=1", f"launch.sampler_servers={servers}", "metrics.tensorboard=false",
                      cwd=tmp_path / str(servers), env=EXAMPLES if store in ("custom", "typed") else None)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[servers] = summary_of(tmp_path / str(servers))
    assert re.search(r"rank 0: [12] sampler server\(s\) ready", res.stdout), res.stdout
    assert runs[2]["param_checksums"] == runs[0]["param_checksums"]
    for key in ("loss", "remote_rows_per_batch", "bytes_sent_per_batch"):
        assert runs[2]["history"][-1].get(key) == runs[0]["history"][-1].get(key), key
    served = [json.loads((tmp_path / "2" / "run" / "metrics" / f"sampler-server-{k}.json").read_text())
              for k in range(2)]
    steps = runs[0]["steps_per_epoch"] * 2 * runs[0]["world_size"]
    assert sum(s["batches_served"] for s in served) == steps and all(s["batches_served"] > 0 for s in served)


@pytest.mark.slow
def test_a_killed_sampler_server_fails_the_run_naming_it(tmp_path):
    log = tmp_path / "out.txt"
    child = subprocess.Popen([sys.executable, "-m", "hpcgnn", "dataset.num_nodes=20000", "train.epochs=50",
                              "train.batch_size=256", "launch.procs=1", "launch.sampler_servers=1",
                              "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}",
                              f"hydra.run.dir={tmp_path / 'run'}"], stdout=log.open("w"), stderr=subprocess.STDOUT,
                             cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    info = tmp_path / "run" / "metrics" / "sampler-server-0.json"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and "epoch 1/50" not in log.read_text():
        time.sleep(0.1)
    assert info.exists(), log.read_text()
    pid = json.loads(info.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    assert child.wait(timeout=60) == 1, log.read_text()
    out = log.read_text()
    assert re.search(r"SamplerFailed: sampler server 0 at 127.0.0.1:\d+ closed the connection \(.*\) while rank 0 "
                     r"was (waiting for batch \d+|sending to it)", out), out


class _Unloadable:
    """A sampler that cannot be unpickled where batches are made (its reduce calls int on a word)."""

    def __reduce__(self):
        return (int, ("unloadable",))


def _unbuildable(state):
    """A sampler server's builder that fails as a sampler that cannot be built there does."""
    return int("unloadable")


@pytest.mark.slow
def test_a_sampler_that_cannot_be_built_fails_the_rank_at_its_start_on_either_transport(tmp_path):
    """Both producers run one serve loop (hpcgnn.sampling.serving): a failure to build the sampler there reaches the
    rank as a failure at the start (batch -1), naming the producer and the error, over the pipe and the socket."""
    import multiprocessing
    import socket

    import torch

    from hpcgnn.errors import SamplerFailed
    from hpcgnn.sampling import shipping
    from hpcgnn.sampling.client import RemotePool
    from hpcgnn.sampling.procs import SamplerPool
    from hpcgnn.sampling.server import run_server
    from hpcgnn.trust import run_secret

    recipe, cpu = shipping.Recipe(None, _Unloadable()), torch.device("cpu")
    pool = SamplerPool(recipe, 1, 2, 1, cpu, rank=0)
    with pytest.raises(SamplerFailed, match=r"sampler process 0 of rank 0 \(pid \d+\) failed at its start: ValueError: "
                                            r"invalid literal for int\(\) with base 10: 'unloadable'\nits traceback"):
        pool.start()
    pool.close()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = run_secret(tmp_path)
    server = multiprocessing.get_context("spawn").Process(target=run_server,
                                                          args=(0, port, 1, 1, str(tmp_path), key, _unbuildable),
                                                          kwargs={"host": "127.0.0.1"})
    server.start()
    remote = RemotePool(shipping.SamplerState("whole", 0, 1), [("127.0.0.1", port)], 2, cpu, rank=0, key=key,
                        run_dir=tmp_path, connect_s=60)
    try:
        with pytest.raises(SamplerFailed, match=r"sampler server 0 at 127.0.0.1:\d+ failed building the sampler of rank "
                                                r"0: ValueError: invalid literal"):
            remote.start()
    finally:
        remote.close()
        server.join(60)
    assert server.exitcode == 1  # (it records its failure, as a failed server does)


def test_a_batch_the_wire_cannot_carry_reaches_the_trainer_as_a_failure_naming_it():
    """A batch is encoded where it is made (the serve loop), not in the server's sending thread: what the wire
    does not carry (here an object in a batch) fails the loop, which reports it to the trainer, instead of
    stopping the sending thread as if the trainer had gone (the trainer would then wait for its batch)."""
    import socket

    import hpcgnn.sampling.messages as m
    import hpcgnn.sampling.wire as wire
    from hpcgnn.sampling.server import _SocketEnd
    from hpcgnn.trust import Session

    a, b = socket.socketpair()
    session = Session(0, 0, 0, b"s" * 32, b"t" * 32)
    end = _SocketEnd(wire.Channel(a, session, server=True), 1, "server 0")
    trainer = wire.Channel(b, session, server=False)
    try:
        with pytest.raises(TypeError, match="a batch holds a object, which the sampler servers' wire does not carry"):
            end.deliver(0, ("Data", {"odd": object()}), None, 0)
        assert end.sender.is_alive() and end.failed is None  # (the connection is still good: the failure goes out)
        end.send(m.Failed(0, "TypeError: a batch holds a object", ""))
        got = trainer.receive()
        assert isinstance(got, m.Failed) and "a batch holds a object" in got.line
    finally:
        end.close(flush=True)
        a.close()
        b.close()
    assert not end.sender.is_alive()


@pytest.mark.parametrize("over", [["model=gcn"], ["train.sampler=cluster", "train.clusters_per_batch=2"],
                                  ["train.sampler=saint_rw"], ["graph=partitioned", "graph.cache_mb=0.05"],
                                  ["dataset=synthetic_hetero"]])
def test_a_server_builds_the_ranks_sampler_from_its_state_and_unpickles_nothing(over, tmp_path, monkeypatch):
    """A server's sampler is built from the run's config, the graph it opens and the state the rank wrote (typed
    fields and raw arrays: a cache's rows, saint_rw's inclusion, the clusters), with every unpickler made to fail:
    its batches equal the rank's own, transform (GCN's degrees) included."""
    import pickle

    import torch

    from hpcgnn.env import RankEnv
    from hpcgnn.models import batch_transform
    from hpcgnn.rng import generator
    from hpcgnn.sampling import BatchLoader, shipping
    from hpcgnn.stores import ServerRecipes
    from hpcgnn.tasks import open_store, task_items

    cfg = make_config(*TINY, *over, f"dataset.root={DATA_ROOT}", run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    if cfg.graph.mode == "partitioned":
        from hpcgnn.data import prepare
        from hpcgnn.partition import ensure_parts

        prepare(cfg.dataset)
        ensure_parts(cfg.dataset, cfg.graph, 1)
    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    store = open_store(cfg, env)
    transform = batch_transform(cfg.model, store.degree)
    side = store.graph_side()
    sha = shipping.publish(cfg.run_dir, 0, side.state)

    def refused(*args, **kwargs):
        raise AssertionError("a sampler server unpickled something")

    monkeypatch.setattr(pickle, "loads", refused)
    monkeypatch.setattr(pickle, "load", refused)
    monkeypatch.setattr(shipping, "loads", refused)
    recipe = ServerRecipes(cfg, task_items(cfg))(shipping.fetch(cfg.run_dir, 0, sha))
    assert (recipe.transform is None) == (transform is None)
    ours = BatchLoader(side.features, side.sampler, [], transform=transform)
    theirs = BatchLoader(recipe.features, recipe.sampler, [], transform=recipe.transform)
    for i, seeds in enumerate(store.train_batches(0)[:3]):
        a, b = (loader.sample(seeds, generator(7, i)) for loader in (ours, theirs))
        assert str(a) == str(b)
        for x, y in zip(_tensors(a), _tensors(b), strict=True):
            assert torch.equal(x, y)


def _tensors(batch) -> list:
    import torch

    store = batch.to_dict() if hasattr(batch, "to_dict") else batch
    out = []
    for key in sorted(store, key=str):
        value = store[key]
        if isinstance(value, dict):
            out += _tensors(value)
        elif isinstance(value, torch.Tensor):
            out.append(value)
    return out


def test_a_sampler_state_is_typed_fields_and_raw_arrays_and_anything_else_is_refused(tmp_path):
    """The state a rank writes for its servers round-trips exactly (bf16 rows, empty arrays, flags); a pickle, an
    object dtype, an array past the payload, or a state of another graph kind are refused, and nothing runs."""
    import json
    import pickle

    import torch

    from hpcgnn.sampling.shipping import STATE_MAGIC, SamplerState
    from hpcgnn.stores import ServerRecipes
    from hpcgnn.tasks.items import NodeItems

    arrays = {"cache_ids": torch.tensor([3, 9, 40]), "cache_x": torch.randn(3, 5).to(torch.bfloat16),
              "none": torch.empty(0, 4, dtype=torch.int32), "mask": torch.tensor([True, False])}
    state = SamplerState("parts", 1, 2, {"num_parts": 4, "edge_ids": True}, arrays)
    back = SamplerState.decode(state.encode())
    assert (back.kind, back.rank, back.world_size, back.values) == ("parts", 1, 2, {"num_parts": 4, "edge_ids": True})
    assert back.arrays.keys() == arrays.keys()
    for name, t in arrays.items():
        assert back.arrays[name].dtype == t.dtype and torch.equal(back.arrays[name], t)

    marker = tmp_path / "ran"

    class Marker:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with pytest.raises(ValueError, match=r"not a sampler state \(its first line differs\)"):
        SamplerState.decode(pickle.dumps(Marker()))
    assert not marker.exists()

    def forged(**arrays) -> bytes:
        header = json.dumps({"kind": "whole", "rank": 0, "world_size": 1, "values": {}, "arrays": arrays}).encode()
        return STATE_MAGIC + len(header).to_bytes(8, "little") + header + bytes(16)

    # (an array's place: [offset, dtype, shape], shipping.Ref, the wire's batch tensors' too)
    for place in ([0, "object", [2]], [0, "int64", [4]], [8, "int64", [2]], [-8, "int64", [1]], [0, "int64", [2**48]],
                  {"dtype": "int64", "shape": [2], "offset": 0, "nbytes": 16}):
        with pytest.raises(ValueError, match=r"a sampler state's array 'a' is not described by a dtype of \[.*\], a "
                                             r"shape of dimensions below 2\*\*48, and a place inside its payload"):
            SamplerState.decode(forged(a=place))
    assert SamplerState.decode(forged(a=[0, "int64", [2]])).arrays["a"].tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"rank 1 asks for a sampler over a parts graph; this server's run is "
                                         r"graph.mode=replicated \(a whole graph\)"):
        ServerRecipes(make_config(*TINY), NodeItems)(state)


def test_every_decoder_of_what_a_file_or_a_peer_brings_raises_only_value_error_with_a_sentence():
    """A few thousand random and structured inputs to the sampler state's decoder and the wire's: before, 37 of 2052
    crafted states raised RecursionError (deep nesting), OverflowError (a shape of 2**64) or RuntimeError (a shape
    whose size wraps int64 past the check). Now each is a ValueError whose message is a sentence, and nothing big is
    allocated."""
    import json
    import random

    from hpcgnn.sampling import wire
    from hpcgnn.sampling.shipping import STATE_MAGIC, SamplerState

    rnd = random.Random(0)

    def state(header) -> bytes:
        raw = header if isinstance(header, bytes) else json.dumps(header).encode()
        return STATE_MAGIC + len(raw).to_bytes(8, "little") + raw + bytes(rnd.choice([0, 8, 64]))

    def arrays(**a):
        return {"kind": "whole", "rank": 0, "world_size": 1, "values": {}, "arrays": a}

    big = [2**64, 2**63, 2**62 + 1, 2**48, -1, 0, 1, 3, 2**31]
    cases = [b"", STATE_MAGIC, STATE_MAGIC + bytes(8), STATE_MAGIC + (2**63).to_bytes(8, "little"),
             state(b"[" * 100_000 + b"]" * 100_000), state(b'{"a":' * 5000 + b"1" + b"}" * 5000),
             state(b"\xff\xfe"), state([]), state(arrays(a="x")), state(arrays(a={"dtype": ["int64"]}))]
    for _ in range(1500):
        shape = [rnd.choice(big) for _ in range(rnd.randrange(0, 5))]
        place = [rnd.choice([0, 8, -8, 2**64, "0"]), rnd.choice(["int64", "bool", "bfloat16", "object", 7, None]),
                 shape]
        if rnd.random() < 0.3:
            place[2] = rnd.choice([None, "2", [1.5], [[2]], [True]])
        if rnd.random() < 0.1:
            place = rnd.choice([place[:2], [*place, 16], {"offset": 0}])
        cases.append(state(arrays(a=place)))
    for _ in range(500):
        cases.append(bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 64))))
        cases.append(STATE_MAGIC + bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 64))))
    for data in cases:
        try:
            SamplerState.decode(data)
        except ValueError as exc:
            assert len(str(exc).split()) >= 4, str(exc)
        else:
            pass  # (a well-formed state, among the random ones: fine)
    bodies = [b"[" * 100_000, b'{"index": 0, "meta": ' + b'{"l": [' * 3000 + b"]}" * 3000 + b', "delta": null}',
              b"\xff", b"null", b"{}", b'{"slot": 2e400}']
    bodies += [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40))) for _ in range(300)]
    for code in range(0, 8):
        for body in bodies:
            try:
                wire.decode(code, body, None)
            except ValueError as exc:
                assert len(str(exc).split()) >= 3, str(exc)
    assert len(cases) + 8 * len(bodies) > 2000


def test_the_servers_config_is_json_that_builds_the_same_config(tmp_path):
    """The servers of a SLURM job read the run's config as JSON fields (nothing pickled), into the same config."""
    from hpcgnn.config import RunConfig
    from hpcgnn.submit.het import write_servers_config

    cfg = make_config("+cluster=devcluster", "cluster.samplers.nodes=1", "dataset=pyg",
                      "dataset._target_=torch_geometric.datasets.Planetoid", "+dataset.kwargs.name=Cora")
    path = write_servers_config(cfg, tmp_path / "submitit")
    assert path.name == "sampler-servers.json" and path.stat().st_mode & 0o777 == 0o600
    assert RunConfig.from_json(path.read_bytes()) == cfg
