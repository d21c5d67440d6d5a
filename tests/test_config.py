"""Config composition, typo and resource checks, and the rendered sbatch script."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_config, run_cli

from hpcgnn.config import RunConfig, check_override_keys
from hpcgnn.errors import ConfigError
from hpcgnn.submit.executor import check_partition_capacity, render_sbatch, slurm_parameters

GOLDEN = Path(__file__).parent / "golden"


def test_defaults_compose_into_frozen_config():
    cfg = make_config()
    assert isinstance(cfg, RunConfig)
    assert (cfg.dataset.name, cfg.model.name, cfg.graph.mode, cfg.cluster) == ("synthetic", "sage", "replicated", None)
    assert cfg.train.fanouts == (10, 5) and isinstance(cfg.train.fanouts, tuple)
    assert cfg.world_size == cfg.launch.procs
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0  # type: ignore[misc]


def test_group_choices_and_cluster_append():
    cfg = make_config("model=gat", "train.lr=0.01", "train.fanouts=[4,3,2]", "+cluster=example_gpu",
                      "cluster.nodes=3")
    assert (cfg.model.name, cfg.model.heads, cfg.train.lr, cfg.train.fanouts) == ("gat", 4, 0.01, (4, 3, 2))
    assert cfg.cluster.nodes == 3 and cfg.cluster.gpus_per_node == 4
    assert cfg.world_size == 12
    assert cfg.cluster.setup == ("module load cuda/12.4", "export NCCL_DEBUG=WARN")


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", r"Unknown config key 'train.lrr'\. Did you mean train.lr\? Valid keys under 'train': "
                    r"accumulate, batch_size, clusters_per_batch, device, edge_budget, epochs, .*lr, .*prefetch, "
                    r".*saint_coverage, sampler, sampler_procs, sampler_threads, seed, .*weight_decay"),
    ("trian.lr=1", r"Unknown config key 'trian.lr'\. Did you mean train\? Valid keys at the top level: .*"),
    ("cluster.gpus_per_nod=1", r"Did you mean cluster.gpus_per_node\?"),
    ("+cluster.foo=1", r"Unknown config key 'cluster.foo'"),
    ("+model.hidden=48", r"Unknown config key 'model.hidden'\. Valid keys under 'model': .*, kwargs, .* HINT: an "
                         r"argument of your model's class goes under model.kwargs: \+model.kwargs.hidden=48$"),
    ("model.hiden_channels=3", r"Did you mean model.hidden_channels\?"),
])
def test_override_typos_name_valid_keys(override, message):
    with pytest.raises(ConfigError, match=message):
        check_override_keys([override])


@pytest.mark.parametrize("overrides, message", [
    (["task.decoder=mlp"], r"Unknown config key 'task.decoder'\. Valid keys under 'task' with task=node: kind, loss, "
                           r"name\. HINT: task.decoder is a setting of task=link or task=edge$"),
    (["task=link", "task.kind=regression"], r"Valid keys under 'task' with task=link: decoder, eval_negatives, form, hits_k, .*"
                                            r"HINT: task.kind is a setting of task=node or task=edge or task=graph$"),
    (["task=edge", "task.negatives=strict"], r"with task=edge: decoder, kind, loss, name, target_edges\. HINT: "
                                             r"task.negatives is a setting of task=link$"),
])
def test_each_task_has_its_own_settings(overrides, message):
    """A task's group holds its own settings' class: another task's key is refused, naming the task it belongs to."""
    with pytest.raises(ConfigError, match=message):
        check_override_keys(overrides)
    with pytest.raises(ConfigError, match=message):
        make_config(*overrides)
    cfg = make_config("task=link", "task.decoder=mlp")
    assert type(cfg.task).__name__ == "LinkTaskConfig" and cfg.task.decoder == "mlp" and not hasattr(cfg.task, "kind")
    assert RunConfig.from_json(cfg.to_json()) == cfg  # (a rank rebuilds the same class from the JSON)


def _choice_fields():
    """Every field of every config class (each task's too) that declares its choices."""
    import typing

    from hpcgnn.specs import datasets, tasks

    classes, seen = [RunConfig, *(s.config for s in tasks.SPECS.values()), *datasets.SOURCES.values()], []
    while classes:
        cls = classes.pop()
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            tp = next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), tp)
            if dataclasses.is_dataclass(tp) and tp not in seen:
                classes.append(tp)
                seen.append(tp)
            elif typing.get_origin(tp) is typing.Literal:
                yield cls, f.name, typing.get_args(tp)


def test_every_declared_choice_is_the_one_check():
    """A field's choices are its annotation's (``Literal``): a value outside them is refused as the config is
    built, naming every one of them; each of them is accepted."""
    from hpcgnn.config import frozen

    fields = list(_choice_fields())
    assert len(fields) >= 30 and {(c.__name__, f) for c, f, _ in fields} >= {
        ("TrainConfig", "precision"), ("NodeTaskConfig", "kind"), ("LinkTaskConfig", "negatives"),
        ("ClusterConfig", "executor"), ("SyntheticConfig", "centroids"), ("OgbConfig", "node_features_from_edges")}
    for cls, name, allowed in fields:
        with pytest.raises(ConfigError, match=rf"{name}='nope' is unknown: use {re.escape(', '.join(allowed[:-1]))}"):
            frozen(cls, {name: "nope"})
        for value in allowed:
            built = frozen(cls, {name: value})  # (a base class: the variant its default name picks)
            assert isinstance(built, cls) and getattr(built, name) == value


def test_valid_overrides_pass_the_typo_guard():
    check_override_keys(["model=gat", "+cluster=local", "cluster.nodes=1", "train.fanouts=[5,5]",
                         "hydra.run.dir=/tmp/x", "dataset.num_nodes=10", "train.lr=1e-3,3e-3"])


@pytest.mark.parametrize("overrides, message", [
    (["+cluster=example_gpu", "cluster.tasks_per_node=2"],
     r"cluster.tasks_per_node=2 but cluster.gpus_per_node=4: hpcgnn runs one rank per GPU\. "
     r"HINT: set cluster.tasks_per_node=4"),
    (["+cluster=local", "cluster.nodes=2"], r"the local executor runs on this machine only\. HINT: set cluster.nodes=1"),
    (["+cluster=example_gpu", "cluster.partition='gpu\nrm -rf /'"], r"contains a line break"),
    (["+cluster=example_gpu", "cluster.nodes=0"], r"cluster.nodes=0 must be at least 1"),
    (["+cluster=example_gpu", "cluster.mem_gb=-1"], r"cluster.mem_gb=-1.0 must be positive"),
    (["+cluster=example_gpu", "cluster.executor=pbs"], r"cluster.executor='pbs' is unknown: use slurm or local"),
    (["train.fanouts=[]"], r"train.fanouts=\[\] must be one or more positive integers"),
    (["train.batch_size=0"], r"train.batch_size=0 must be at least 1"),
    (["model.name=transformer"], r"model.name='transformer' is unknown: use one of custom, gat, gcn, gin, mlp, rgcn, sage"),
    (["dataset.train_fraction=0.95"], r"must be positive and sum to less than 1"),
    (["dist.backend=mpi"], r"dist.backend='mpi' is unknown"),
    (["train.graph_on=gpu"], r"train.graph_on='gpu' is unknown: use auto, host or device"),
    (["train.graph_on=device", "graph=partitioned"], r"train.graph_on=device does not go with graph=partitioned.*"
     r"HINT: set train.graph_on=auto"),
    (["train.graph_on=device", "train.sampler=cluster"], r"does not go with train.sampler=cluster"),
    (["train.graph_on=device", "train.device=cpu"], r"does not go with train.device=cpu"),
    (["train.graph_on=device", "task=link"], r"does not go with task=link \(only node tasks sample on the GPU\)"),
    (["train.graph_on=device", "train.device=cuda", "task=edge"], r"does not go with task=edge"),
    (["train.graph_on=device", "train.device=cuda", "launch.sampler_servers=1"],
     r"does not go with 1 sampler server\(s\) \(they make batches on their own hosts\)"),
])
def test_invalid_values_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_config(*overrides)


def test_golden_sbatch_example_cluster():
    cfg = make_config("+cluster=example_gpu", run_dir="/scratch/alice/hpcgnn/run-1")
    text = render_sbatch(cfg, python="/opt/venv/bin/python")
    golden = (GOLDEN / "example_gpu.sbatch").read_text()
    assert text == golden, "rendered sbatch changed: if intended, update tests/golden/example_gpu.sbatch"


@pytest.mark.parametrize("method, nodes", [("metis", 1), ("random", 1), ("lp", 4)])
def test_partitioning_job_spans_the_nodes_only_for_lp(method, nodes):
    """lp shares the work among one task per node of cluster.nodes; METIS and random are one process's."""
    from hpcgnn.submit.partition_job import partition_job_config

    cfg = make_config("+cluster=example_gpu", "cluster.nodes=4", "graph=partitioned", f"graph.method={method}")
    c = partition_job_config(cfg).cluster
    assert (c.nodes, c.tasks_per_node, c.gpus_per_node) == (nodes, 1, 0)
    assert f"#SBATCH --nodes={nodes}" in render_sbatch(partition_job_config(cfg), python="/opt/venv/bin/python")


HOSTILE = {
    "job_name": "x'; touch /tmp/pwned-job; echo '",
    "partition": "gpu;touch /tmp/pwned",
    "account": "$(touch /tmp/pwned)",
    "qos": "`id`",
    "constraint": 'a100"&&id',
}


@pytest.mark.slow
def test_hostile_values_are_inert_quoted_data(tmp_path):
    cfg = make_config("+cluster=example_gpu")
    cluster = dataclasses.replace(cfg.cluster, **HOSTILE, sbatch_extra={"comment": "a b;$(id)"})
    cfg = dataclasses.replace(cfg, cluster=cluster, run_dir=str(tmp_path / "run dir; $(id)"))
    cfg.validate()  # one-line values are legal: quoting, not rejection, makes them safe
    text = render_sbatch(cfg, python="/opt/venv/bin/python")
    flags = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.removeprefix("#SBATCH --").partition("=")
            # sbatch reads the value like a shell word: it must come back unchanged.
            flags[key] = shlex.split(value)[0] if value else True
    for key, value in HOSTILE.items():
        assert flags[key.replace("_", "-")] == value
    assert flags["comment"] == "a b;$(id)"
    # The command lines after the #SBATCH block: bash must see the hostile run folder as one word.
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    assert words[-1] == str(tmp_path / "run dir; $(id)" / "submitit")
    # And executing the script body with srun stubbed runs nothing hostile.
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "srun").write_text("#!/bin/sh\necho \"$@\" > \"$SRUN_ARGS\"\n")
    (stub / "srun").chmod(0o755)
    (stub / "module").write_text("#!/bin/sh\n")
    (stub / "module").chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(text)
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path,
                   env={"PATH": f"{stub}:/usr/bin:/bin", "SRUN_ARGS": str(tmp_path / "srun.args")})
    assert not list(tmp_path.glob("pwned*")) and not Path("/tmp/pwned").exists()
    assert "run dir; $(id)/submitit" in (tmp_path / "srun.args").read_text()


def test_slurm_parameters_cover_the_cluster_file():
    cfg = make_config("+cluster=example_gpu")
    params = slurm_parameters(cfg.cluster)
    assert params["nodes"] == 2 and params["ntasks_per_node"] == 4 and params["gpus_per_node"] == 4
    assert params["mem"] == "256G" and params["time"] == 240 and params["partition"] == "gpu"
    assert params["additional_parameters"] == {"mail-type": "FAIL"}


@pytest.mark.slow
def test_cli_dry_run_prints_script_and_config(tmp_path):
    res = run_cli("+cluster=example_gpu", "launch.dry_run=true", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --ntasks-per-node=4" in res.stdout and "#SBATCH --nodes=2" in res.stdout
    assert "srun --unbuffered" in res.stdout and "module load cuda/12.4" in res.stdout
    assert "# resolved config" in res.stdout and "gpus_per_node: 4" in res.stdout
    assert not (tmp_path / "run" / "submitit").exists()  # nothing submitted


@pytest.mark.slow
def test_cli_typo_fails_fast_with_valid_names(tmp_path):
    res = run_cli("train.epoch=3", cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert "Did you mean train.epochs?" in res.stderr and "Valid keys under 'train'" in res.stderr


@pytest.mark.slow
def test_cli_invalid_resources_fail_before_submission(tmp_path):
    res = run_cli("+cluster=example_gpu", "cluster.tasks_per_node=8", cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert "HINT: set cluster.tasks_per_node=4" in res.stderr


@pytest.mark.slow
def test_user_cluster_folder(tmp_path):
    folder = tmp_path / "mine" / "cluster"
    folder.mkdir(parents=True)
    (folder / "mycluster.yaml").write_text("defaults:\n  - base_cluster\nname: mycluster\npartition: big\nnodes: 3\n")
    res = run_cli("+cluster=mycluster", "launch.dry_run=true", cwd=tmp_path, timeout=120,
                  env={"HPCGNN_CONFIG_DIR": str(tmp_path / "mine")})
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --partition=big" in res.stdout and "#SBATCH --nodes=3" in res.stdout
    res = run_cli("+cluster=mycluster", "launch.dry_run=true", cwd=tmp_path, timeout=120,
                  env={"HPCGNN_CONFIG_DIR": str(tmp_path / "elsewhere")})
    assert res.returncode != 0 and "Could not find 'cluster/mycluster'" in res.stderr


SRUN = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "train"}


@pytest.mark.parametrize("environ, cluster, mode", [
    ({}, [], "local"),
    ({}, ["+cluster=example_gpu"], "submit"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, [], "rank"),
    ({**SRUN, "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4"},
     ["+cluster=example_gpu"], "rank"),  # srun started us: never submit again from inside a task
    ({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, [], "rank"),  # batch step: srun missing
    ({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, ["+cluster=example_gpu"], "submit"),
    ({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, [], "local"),
    # A one-task step a script started is a rank ...
    ({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1"}, [], "rank"),
    # ... but not a shell a user types in: srun --pty bash, or a job named bash / interactive.
    ({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PTY_PORT": "4242"}, [], "local"),
    ({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PTY_PORT": "4242"},
     ["+cluster=example_gpu"], "submit"),
    ({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_NAME": "bash"}, [], "local"),
    ({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_NAME": "interactive"},
     ["+cluster=example_gpu"], "submit"),
    # A salloc shell (no step) with several tasks: not a batch script that forgot srun.
    ({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NAME": "interactive"}, [], "local"),
    # Several tasks in one step are ranks, whatever the job is called (srun inside salloc).
    ({**SRUN, "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NAME": "interactive"}, [], "rank"),
    # launch.mode decides when given.
    ({**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PTY_PORT": "4242"},
     ["launch.mode=rank"], "rank"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, ["launch.mode=local"], "local"),
    ({}, ["+cluster=example_gpu", "launch.mode=local"], "local"),
])
def test_launch_mode(environ, cluster, mode):
    from hpcgnn.submit.launch import launch_mode

    got, why = launch_mode(make_config(*cluster), environ)
    assert got == mode
    if "SLURM_PTY_PORT" in environ and "launch.mode=rank" not in cluster:
        assert "SLURM_PTY_PORT is set (srun --pty)" in why and "launch.mode=rank trains in this process" in why


def test_launch_mode_is_checked():
    with pytest.raises(ConfigError, match=r"launch.mode='srun' is unknown: use auto, submit, local or rank"):
        make_config("launch.mode=srun")
    with pytest.raises(ConfigError, match=r"launch.mode=submit needs a cluster to submit to. HINT: add \+cluster=NAME"):
        make_config("launch.mode=submit")


@pytest.mark.slow
def test_cli_in_slurm_batch_step_without_srun_shows_the_srun_line(tmp_path):
    batch_step = {"SLURM_JOB_ID": "31337", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4",
                  "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
                  "SLURM_TASKS_PER_NODE": "2(x2)"}
    res = run_cli("dataset.num_nodes=1000", cwd=tmp_path, timeout=120, env=batch_step)
    assert res.returncode == 2
    assert "SLURM allocated 4 tasks but only this one is running" in res.stderr
    assert "srun python -m hpcgnn" in res.stderr


# As `sinfo -h -o "%P|%D|%c|%m|%G|%l|%N"` prints it: one line per node group of a partition.
SINFO = "gpu|1|64|256000|gpu:a100:4|2-00:00:00|g001\ngpu|1|128|512000|gpu:a100:4|2-00:00:00|g002\n" \
        "cpu*|8|32|192000|(null)|1-00:00:00|c[001-008]\n"


@pytest.mark.parametrize("override, message", [
    ({"nodes": 3}, r"cluster.nodes=3 but partition gpu has 2 nodes. HINT: set cluster.nodes=2"),
    ({"cpus_per_task": 40}, r"4 x cluster.cpus_per_task=40 CPUs, but the nodes of partition gpu have at most 128"),
    ({"mem_gb": 600}, r"cluster.mem_gb=600 but the nodes of partition gpu have at most 500.0 GB"),
    ({"nodes": 2, "cpus_per_task": 20}, r"has only 1 such nodes"),
])
def test_resources_beyond_the_partition_fail_before_submission(override, message):
    c = dataclasses.replace(make_config("+cluster=example_gpu").cluster, **override)
    with pytest.raises(ConfigError, match=message):
        check_partition_capacity(c, sinfo=SINFO)


def test_resources_within_the_partition_pass():
    c = make_config("+cluster=example_gpu").cluster
    check_partition_capacity(c, sinfo=SINFO)
    unknown = "gpu|2|128|1|gpu:4|infinite|g[1-2]\n"  # RealMemory not configured: no memory check
    check_partition_capacity(dataclasses.replace(c, mem_gb=10**6), sinfo=unknown)


def test_golden_sbatch_with_hostile_values():
    """Quotes, ';', '$()', backticks in every field land in the script as inert, quoted words."""
    cfg = make_config("+cluster=example_gpu")
    cluster = dataclasses.replace(cfg.cluster, **HOSTILE, sbatch_extra={"comment": "a b;$(id)"})
    cfg = dataclasses.replace(cfg, cluster=cluster, run_dir="/scratch/run dir; $(touch /tmp/pwned)")
    text = render_sbatch(cfg, python="/opt/venv/bin/python")
    golden = (GOLDEN / "hostile.sbatch").read_text()
    assert text == golden, "rendered sbatch changed: if intended, update tests/golden/hostile.sbatch"


@pytest.mark.parametrize("field", ["job_name", "partition", "account"])
def test_line_breaks_in_sbatch_values_are_refused(field):
    """A newline would end the #SBATCH line and start a shell line (setup lines are shell on purpose)."""
    cfg = make_config("+cluster=example_gpu")
    bad = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, **{field: "gpu\n#SBATCH --wrap=id"}))
    with pytest.raises(ConfigError, match=f"cluster.{field}=.* contains a line break: sbatch options must be one line"):
        bad.validate()


def test_every_spec_names_code_that_is_there():
    """Each spec (tasks, models, samplers) names its unit and builders by "module:name": each one imports, a
    task's unit carries its spec's name, and its items' unit is one (what a store opens)."""
    from hpcgnn.specs import load, models, samplers, tasks
    from hpcgnn.tasks.items import Items

    for spec in tasks.SPECS.values():
        assert load(spec.unit).name == spec.name
        assert issubclass(load(spec.batches), Items) and callable(load(spec.model)) and callable(load(spec.check))
        assert issubclass(spec.config, tasks.TaskConfig) and spec.config.name == spec.name  # (its settings' class)
    named = [(s.name, d) for s in models.SPECS.values() for d in (s.build, s.typed_build) if d]
    named += [(s.name, d) for s in samplers.SPECS.values() for d in (s.prepare, s.build)]
    assert all(callable(load(dotted)) for _, dotted in named), named
    assert {n for n, _ in named} == {*models.SPECS, *samplers.SPECS}


@pytest.mark.slow
def test_the_launching_process_imports_no_torch():
    """The whole submitting side (every module of hpcgnn/submit/, and the command itself) imports neither torch
    nor PyG, and composing a job (local, sweep or SLURM) neither: the command starts its ranks or submits in a
    fraction of a second."""
    code = ("import importlib, pkgutil, sys; import hpcgnn.submit as side; from hpcgnn.submit.compose import compose; "
            "[importlib.import_module(m.name) for m in pkgutil.iter_modules(side.__path__, 'hpcgnn.submit.')]; "
            "import hpcgnn.__main__; "
            "[compose(o) for o in (['run_dir=/tmp/x'], ['task=link', 'run_dir=/tmp/x'], "
            "['+cluster=devcluster', 'graph=partitioned', 'run_dir=/tmp/x'])]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_geometric')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_a_clone_and_an_editable_install_read_the_repositorys_conf():
    """The configs live in the repository's top-level conf/ (a wheel installs them inside the package:
    test_install), and a clone or an editable install composes from that folder."""
    from conftest import REPO

    import hpcgnn

    assert hpcgnn.CONF_DIR == REPO / "conf" and (REPO / "conf" / "config.yaml").is_file()
    assert not (REPO / "hpcgnn" / "conf").exists()


def test_the_result_line_counts_ranks_in_words(capsys):
    from hpcgnn.submit.follow import print_result

    summary = {"metric": "val_acc", "test": 0.91614, "best_val": 0.9147, "best_epoch": 2, "world_size": 1,
               "hostnames": ["vm"], "seeds_per_s": 36810.2, "wall_time_s": 6.21, "run_dir": "/tmp/run",
               "eval_mode": "sampled"}
    print_result(summary)
    print_result({**summary, "world_size": 4, "hostnames": ["n1", "n2"], "eval_mode": "full"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("test accuracy 0.9161 (best val 0.9147 at epoch 2, sampled evaluation), 1 rank on vm, 36810 "
                        "seeds/s, 6.2 s")  # (which evaluation gave the number: sampled understates some tasks)
    assert lines[2].startswith("test accuracy 0.9161 (best val 0.9147 at epoch 2, exact evaluation), 4 ranks on n1, ")


@pytest.mark.parametrize("producer", ["train.sampler_procs=1", "launch.sampler_servers=1"])
def test_graph_on_auto_samples_on_the_host_where_batches_are_made_off_the_rank(producer):
    """Sampler processes and servers read the graph on the host: auto never copies it to the GPU for them
    (decided before CUDA is asked anything, so this holds on a machine without one)."""
    import torch

    from hpcgnn.env import RankEnv
    from hpcgnn.stores.replicated import graph_on

    cfg = make_config(producer, "train.device=cuda")
    assert graph_on(cfg, RankEnv.from_environ({}), torch.device("cuda", 0), 1) == "host"


@pytest.mark.parametrize("override", ["model=../../elsewhere/evil", "model=/home/them/evil", "dataset=../x",
                                      "+cluster=../../../tmp/theirs", "model=sage/../../x", "hydra.searchpath=[/tmp/x]"])
def test_a_config_group_value_is_an_options_name_never_a_path(override, capsys):
    """Hydra composes a group's value as a YAML path: ``model=../../<path>/evil`` composed another user's file (its
    ``# @package _global_`` set any _target_). Now it exits 2 with one line before anything is read."""
    from hpcgnn.__main__ import main

    assert main([override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"hpcgnn: config error: .*(not a path|your config folder alone)",
                                       err[0]), err
    assert main(["-m", "model=sage,../../x", "launch.dry_run=true"]) == 2


def test_a_checkpoint_of_every_tasks_settings_resumes_into_its_own_tasks():
    """A checkpoint written when the task group held every task's settings (a node task's with task.decoder, a
    synthetic graph's with dataset.path) resumes into a config that has only its own: what it lacks is none of its
    business; a setting of its own that changed is still refused or applied."""
    from hpcgnn.rank.checkpoint import flat_config, resume_changes

    now = flat_config(make_config())
    saved = {**now, "task.decoder": "dot", "task.negatives": "uniform", "task.hits_k": [20, 50, 100],
             "dataset.path": None, "dataset._target_": None}
    assert resume_changes(saved, now) == ([], [])
    applied, refused = resume_changes({**saved, "task.kind": "regression", "train.lr": 0.03}, now)
    assert [c["setting"] for c in applied] == ["train.lr"] and [c["setting"] for c in refused] == ["task.kind"]
