"""Real SLURM: jobs submitted by `python -m hpcgnn +cluster=devcluster` to the two-node dev cluster.

`.ci/run` starts the cluster (slurm/devcluster/start.sh) and exports SLURM_CONF. In CI these
tests fail when the cluster is not really up; elsewhere they skip and say how to start it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ACCURACY_BAR, DATA_ROOT, REPO, run_cli

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def _needs_the_cluster(devcluster_up):
    """Every test here runs on the dev cluster (skipped without it, a failure in CI)."""


def _summary(folder: Path) -> dict:
    return json.loads((folder / "run" / "summary.json").read_text())


def _job_id(stdout: str) -> str:
    m = re.search(r"submitted job (\d+) to devcluster", stdout)
    assert m, stdout
    return m.group(1)


def _sacct(job_id: str, fields: str = "State") -> list[str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", fields], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip().split("|")


def _submitted_until(folder: Path, text: str, *over: str) -> tuple[str, Path]:
    """Submit a run without waiting; return once rank 0's log shows ``text``: the job id and that log."""
    res = run_cli(*over, "launch.wait=false", cwd=folder, timeout=120)
    assert res.returncode == 0, res.stderr
    job = _job_id(res.stdout)
    log = folder / "run" / "submitit" / f"{job}_0_log.out"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and text not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert text in log.read_text()
    return job, log


def _final_state(job_id: str, limit_s: float = 60) -> str:
    """The job's state once accounting has caught up (sacct may still say RUNNING for a moment)."""
    deadline = time.monotonic() + limit_s
    state = _sacct(job_id)[0]
    while state in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED", "") and time.monotonic() < deadline:
        time.sleep(1)
        state = _sacct(job_id)[0]
    return state


# 2 nodes x 1 rank, small enough for CI, large enough to clear the accuracy bar. Rank 0 sleeps 0.1 s per step
# (it changes no parameter) so that an epoch lasts a few seconds: the preemption test signals mid-epoch.
COMMON = ["+cluster=devcluster", "train.epochs=3", "dataset.num_nodes=20000", "train.batch_size=128",
          "debug.slow_rank=0", "debug.slow_s=0.1", "metrics.tensorboard=false"]


# The 2 nodes x 2 ranks job: submitted without waiting just before the reference, so the two jobs share the
# nodes at the same time (the port collision check) while the reference runs.
TWO_PER_NODE = ["train.epochs=4", "debug.slow_rank=-1", "cluster.tasks_per_node=2"]


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory) -> dict:
    """Two jobs at once on the same nodes: the 2x2 job (not waited for), then the uninterrupted 2x1 job (the
    CLI waits for it): the accuracy bar with both layouts, and the reference the preempted job must match."""
    four = tmp_path_factory.mktemp("two-per-node")
    res = run_cli(*COMMON, *TWO_PER_NODE, "launch.wait=false", cwd=four, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    four_id = _job_id(res.stdout)
    folder = tmp_path_factory.mktemp("two-nodes")
    res = run_cli(*COMMON, cwd=folder, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (four / "run" / "summary.json").exists():
        time.sleep(1)
    return {"2x1": (folder, res.stdout), "2x2": (four, four_id)}


@pytest.fixture(scope="module")
def two_node_run(two_jobs) -> tuple[Path, str]:
    """The uninterrupted 2-node job: its folder and the CLI's output."""
    return two_jobs["2x1"]


def _check_layout(s: dict, job_id: str, tasks_per_node: int) -> None:
    assert s["launcher"] == "slurm" and s["job_id"] == job_id
    assert s["world_size"] == 2 * tasks_per_node and s["num_nodes"] == 2
    assert s["hostnames"] == ["n1", "n2"]
    assert s["rank_hosts"] == ["n1"] * tasks_per_node + ["n2"] * tasks_per_node  # block distribution
    assert s["master_addr"] == "n1"  # first node of SLURM_JOB_NODELIST=n[1-2]
    assert len(set(s["param_checksums"])) == 1
    assert s["test_acc"] >= ACCURACY_BAR, s["test_acc"]


def test_multi_node_training_reaches_the_local_bar(two_node_run):
    folder, stdout = two_node_run
    job_id = _job_id(stdout)
    _check_layout(_summary(folder), job_id, 1)
    assert "test accuracy" in stdout  # the CLI waited for the job and printed its result
    assert _final_state(job_id) == "COMPLETED"


def test_predict_is_submitted_like_training_and_prints_the_runs_accuracy(two_node_run):
    """hpcgnn predict on a 2-node run: a job of its own on both nodes (the run's cluster and layout), each rank
    writing its nodes, and the run's test accuracy printed again."""
    folder, _ = two_node_run
    run, trained = folder / "run", _summary(folder)
    res = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run)], capture_output=True, text=True,
                         cwd=folder, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"submitted job \d+ to devcluster \(2 tasks\)", res.stdout), res.stdout
    assert f"test accuracy {trained['test']:.4f} over 12000 nodes (the run's: {trained['test']:.4f}; epoch " \
           f"{trained['best_epoch']}, best.pt, full inference), 2 ranks on n1, n2" in res.stdout, res.stdout
    manifest = json.loads((run / "predict" / "predictions-test-best" / "manifest.json").read_text())
    assert manifest["rows"] == 12000 and manifest["world_size"] == 2


def test_two_ranks_per_node_reach_the_local_bar(two_jobs):
    folder, job_id = two_jobs["2x2"]
    _check_layout(_summary(folder), job_id, 2)
    assert _final_state(job_id) == "COMPLETED"


def test_two_jobs_at_once_do_not_collide(two_jobs):
    (fa, out), (fb, id_b) = two_jobs["2x1"], two_jobs["2x2"]
    ids = [_job_id(out), id_b]
    a, b = _summary(fa), _summary(fb)
    assert a["master_port"] != b["master_port"]
    assert {a["master_addr"], b["master_addr"]} == {"n1"}  # same nodes, same master host
    # They really ran at the same time on the same nodes.
    for i in ids:
        assert _final_state(i) == "COMPLETED"
    (sa, ea), (sb, eb) = (_sacct(i, "Start,End") for i in ids)
    assert max(sa, sb) < min(ea, eb), (sa, ea, sb, eb)


def test_failing_rank_ends_the_job_with_its_traceback(tmp_path, tiny_overrides):
    t0 = time.monotonic()
    res = run_cli("+cluster=devcluster", "cluster.tasks_per_node=2", *tiny_overrides, "debug.fail_rank=2",
                  "debug.fail_step=2", cwd=tmp_path, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert time.monotonic() - t0 < 300  # bounded (no hang); generous for CI, not a timing test
    assert "first failure, rank 2 on n2:" in res.stderr
    assert "RuntimeError: injected failure on rank 2 at step 2 (debug.fail_rank)" in res.stderr
    assert _final_state(_job_id(res.stdout)) == "FAILED"


def test_scancel_is_reported_as_cancelled(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "hpcgnn", "+cluster=devcluster", "train.epochs=200",
                             "launch.state_poll_s=3", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        job_id = _job_id(proc.stdout.readline())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _sacct(job_id) != ["RUNNING"]:
            time.sleep(1)
        assert _sacct(job_id) == ["RUNNING"]
        subprocess.run(["scancel", job_id], check=True)
        out, err = proc.communicate(timeout=90)  # prompt: the CLI notices within a few polls
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert f"job {job_id} was cancelled (CANCELLED" in err
    assert _final_state(job_id).startswith("CANCELLED")


def test_entry_under_sbatch_without_srun_is_detected(tmp_path):
    script = tmp_path / "no-srun.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --output={tmp_path}/out.log
{sys.executable} -m hpcgnn dataset.num_nodes=1000 hydra.run.dir={tmp_path}/run
""")
    res = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr  # the job's exit code
    log = (tmp_path / "out.log").read_text()
    assert "SLURM allocated 2 tasks but only this one is running" in log
    assert "    srun python -m hpcgnn ..." in log


def test_dry_run_script_is_the_one_that_ran(two_node_run):
    """The same command with launch.dry_run=true prints exactly the script that the real submission wrote."""
    folder, stdout = two_node_run
    dry = run_cli(*COMMON, "launch.dry_run=true", cwd=folder, timeout=120)
    assert dry.returncode == 0, dry.stderr
    rendered = dry.stdout.split("# sbatch script\n", 1)[1].split("\n\n# resolved config\n", 1)[0]
    written = (folder / "run" / "submitit" / f"{_job_id(stdout)}_submission.sh").read_text()
    assert written == rendered


def test_plain_sbatch_template(tmp_path, tiny_overrides):
    """slurm/train.sbatch as a user submits it (minus its GPU request: the dev cluster has none)."""
    text = (REPO / "slurm" / "train.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=" in text
    script = tmp_path / "train.sbatch"
    script.write_text("\n".join(line for line in text.splitlines() if "--gpus-per-node" not in line) + "\n")
    res = subprocess.run(["sbatch", "--wait", "--parsable", "--ntasks-per-node=1", "--cpus-per-task=1",
                          "--time=10", f"--output={tmp_path}/%j.out", str(script), *tiny_overrides,
                          f"dataset.root={DATA_ROOT}"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "HPCGNN_PYTHON": sys.executable})
    job_id = res.stdout.strip().split(";")[0]
    assert res.returncode == 0, res.stderr + (tmp_path / f"{job_id}.out").read_text()
    runs = list((tmp_path / "outputs").glob(f"slurm-{job_id}.*"))
    assert len(runs) == 1  # two ranks on two nodes, one run folder
    s = json.loads((runs[0] / "summary.json").read_text())
    assert s["world_size"] == 2 and s["hostnames"] == ["n1", "n2"] and s["master_addr"] == "n1"
    assert (tmp_path / f"{job_id}.out").read_text().count("test accuracy") == 1


def test_partitioned_run_waits_for_its_partitioning_job(tmp_path):
    """Missing parts: a partitioning job first (lp: one task on each of the two nodes, sharing the work),
    training after it (afterok), on both nodes, evaluated exactly (each node's rank its own nodes)."""
    res = run_cli("+cluster=devcluster", "graph=partitioned", "graph.method=lp", "graph.seed=11",
                  "dataset.num_nodes=20000", "train.epochs=2", "train.eval_mode=full", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"submitted partitioning job (\d+) to devcluster", res.stdout)
    assert m, res.stdout
    part_job, train_job = m.group(1), _job_id(res.stdout)
    assert f"after partitioning job {part_job}" in res.stdout
    assert _final_state(part_job) == "COMPLETED"
    assert _sacct(part_job, "NNodes") == ["2"]
    logs = sorted((tmp_path / "run" / "partition" / "submitit").glob(f"{part_job}_*_log.out"))
    assert len(logs) == 2, logs
    for t, log in enumerate(logs):  # cluster.cpus_per_task=1 of devcluster, not the 2 cores each task sees
        assert f"task {t}/2: 1 threads, peak RSS" in log.read_text()
    part_end, = _sacct(part_job, "End")
    train_start, = _sacct(train_job, "Start")
    assert part_end <= train_start  # ISO timestamps: the dependency held
    s = _summary(tmp_path)
    assert s["graph_mode"] == "partitioned" and s["hostnames"] == ["n1", "n2"]
    assert s["eval_mode"] == "full" and s["test_acc"] > 0.6, s["test_acc"]


def test_an_edge_task_prepares_its_targets_on_both_nodes_at_once_and_trains_partitioned(tmp_path):
    """task=edge on a graph of its own seed, partitioned: each node's local rank 0 prepares the edge targets beside
    the graph the partitioning job prepared, both at once on the shared file system; the first one's folder is
    kept (before, the second node's failed to take its place, and the job failed), and both ranks train."""
    res = run_cli("+cluster=devcluster", "task=edge", "graph=partitioned", "dataset.num_nodes=20000", "dataset.seed=31",
                  "train.epochs=10", "metrics.tensorboard=false", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    s = _summary(tmp_path)
    assert s["task"] == "edge" and s["graph_mode"] == "partitioned" and s["hostnames"] == ["n1", "n2"]
    assert s["test_acc"] > 0.75, s["test_acc"]


def test_a_graph_task_trains_as_one_job_across_both_nodes_as_it_does_on_one(tmp_path):
    """task=graph as one job on n1 and n2: each node's local rank 0 prepares the graph set (a seed of its own, so
    both at once on the shared file system) and its rank maps it; the run equals 2 local ranks on one node, bit for
    bit (the same steps dealt to the same ranks)."""
    over = ["task=graph", "dataset.num_graphs=2000", "dataset.seed=41", "model.hidden_channels=32", "task.layers=3",
            "train.epochs=2", "train.precision=fp32", "metrics.tensorboard=false"]
    res = run_cli("+cluster=devcluster", *over, cwd=tmp_path / "nodes", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    local = run_cli(*over, "launch.procs=2", "train.num_threads=1", cwd=tmp_path / "here", timeout=300)
    assert local.returncode == 0, local.stdout + local.stderr
    s, one = _summary(tmp_path / "nodes"), _summary(tmp_path / "here")
    assert s["task"] == "graph" and s["hostnames"] == ["n1", "n2"] and one["num_nodes"] == 1
    assert s["param_checksums"] == one["param_checksums"] and s["test_acc"] == one["test_acc"]
    assert [r["val_acc"] for r in s["history"]] == [r["val_acc"] for r in one["history"]]


def test_failed_partitioning_cancels_training_with_the_reason(tmp_path):
    # A graph not prepared yet: only the partitioning job can learn its size, and fails.
    res = run_cli("+cluster=devcluster", "graph=partitioned", "graph.partition_mem_gb=0.0001", "dataset.seed=12",
                  "dataset.num_nodes=20000", "launch.state_poll_s=2", cwd=tmp_path, timeout=300)
    assert res.returncode == 1
    assert re.search(r"job \d+ was cancelled \(CANCELLED\S*\): partitioning job \d+ ended FAILED", res.stderr), res.stderr
    assert "PartitionError: partitioning with graph.method=metis needs about" in res.stderr


def test_partitioning_that_cannot_fit_is_refused_before_submitting(tmp_path):
    """A prepared graph and a known memory limit: the launcher refuses at submit time, exit 2."""
    from hpcgnn.config import dataset_config
    from hpcgnn.data import prepare

    prepare(dataset_config(num_nodes=20000, seed=13, root=str(DATA_ROOT)))
    res = run_cli("+cluster=devcluster", "graph=partitioned", "cluster.mem_gb=0.001", "dataset.seed=13",
                  "dataset.num_nodes=20000", cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert "partitioning with graph.method=metis needs about" in res.stderr and "HINT: use graph.method=lp" in res.stderr
    assert "submitted" not in res.stdout


def test_preempted_job_requeues_resumes_and_matches_an_uninterrupted_one(tmp_path, two_node_run):
    """SLURM delivers USR2 to both nodes mid-epoch: checkpoint, requeue, resume, same parameters."""
    cut = tmp_path / "cut"
    job, log = _submitted_until(cut, "epoch 1/3", *COMMON)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # to every task of the job's steps
    assert _final_state(job, limit_s=400) == "COMPLETED"
    text = log.read_text()
    assert "asking submitit to requeue the job" in text and "(resume 1)" in text
    s, ref = _summary(cut), _summary(two_node_run[0])
    assert s["requeues"] == 1 and s["resumes"] == 1 and s["hostnames"] == ["n1", "n2"]
    assert s["param_checksums"] == ref["param_checksums"]


def test_more_nodes_than_the_partition_has_is_refused_before_submitting(tmp_path):
    res = run_cli("+cluster=devcluster", "cluster.nodes=3", cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert "cluster.nodes=3 but partition debug has 2 nodes. HINT: set cluster.nodes=2" in res.stderr
    assert "submitted" not in res.stdout
    # no job of its own: none queued from its folder (another test's jobs may come and go meanwhile)
    queued = subprocess.run(["squeue", "-h", "-o", "%Z"], capture_output=True, text=True).stdout.split()
    assert not [d for d in queued if d.startswith(str(tmp_path))], queued


def test_sweep_is_one_job_array_submitted_in_seconds_and_status_follows_it(tmp_path):
    sweep = tmp_path / "sweep"
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "hpcgnn", "-m", "model=sage,gcn", "train.lr=1e-3,3e-3",
                          "+cluster=devcluster", "dataset.num_nodes=4000", "train.epochs=1", f"dataset.root={DATA_ROOT}",
                          f"hydra.sweep.dir={sweep}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"submitted a sweep of 4 members to devcluster as 1 job array\(s\) \((\d+)\)", res.stdout)
    assert m, res.stdout
    assert took < 120, took  # returned without waiting for the jobs (generous bound for a loaded CI machine)
    manifest = json.loads((sweep / "manifest.json").read_text())
    assert [e["job_id"] for e in manifest["members"]] == [f"{m.group(1)}_{i}" for i in range(4)]
    st = subprocess.run([sys.executable, "-m", "hpcgnn.submit.status", str(sweep), "--wait", "--poll-s", "2"],
                        capture_output=True, text=True, timeout=900)
    assert st.returncode == 0, st.stdout + st.stderr
    rows = st.stdout.strip().splitlines()[1:]
    assert len(rows) == 4 and all("COMPLETED" in r and "1/1" in r for r in rows), st.stdout
    for e in manifest["members"]:
        assert json.loads((Path(e["run_dir"]) / "summary.json").read_text())["hostnames"] == ["n1", "n2"]


def test_cluster_init_describes_the_dev_cluster_and_its_file_runs_a_job(tmp_path):
    env = {**os.environ, "HPCGNN_CONFIG_DIR": str(tmp_path / "conf")}
    res = subprocess.run([sys.executable, "-m", "hpcgnn.submit.cluster", "init", "discovered"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "conf" / "cluster" / "discovered.yaml").read_text()
    for line in ("partition: debug", "nodes: 2  # of 2", "cpus_per_task: 4", "gpus_per_node: 0", "mem_gb: 7"):
        assert line in text, text
    run = run_cli("+cluster=discovered", "cluster.cpus_per_task=1", "dataset.num_nodes=4000", "train.epochs=1",
                  cwd=tmp_path, timeout=600, env={"HPCGNN_CONFIG_DIR": str(tmp_path / "conf")})
    assert run.returncode == 0, run.stdout + run.stderr
    assert _summary(tmp_path)["hostnames"] == ["n1", "n2"]


# ------------------------------------------------------------------ a shell inside an allocation

TINY = ["dataset.num_nodes=4000", "train.epochs=2", "train.batch_size=256", "model.hidden_channels=32",
        "metrics.tensorboard=false"]


def _in_step(srun: list[str], command: list[str], cwd: Path, pty: bool, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``command`` inside a new one-task SLURM step, as a user would type it there.

    With ``pty``: ``srun --pty`` under util-linux's ``script``, which gives srun the terminal it
    needs (without one, srun drops --pty and sets no SLURM_PTY_PORT)."""
    inner = " ".join(shlex.quote(str(c)) for c in command)
    line = ["srun", *srun, *(["--pty"] if pty else []), "bash", "-c", inner]
    if pty:
        line = ["script", "-qec", " ".join(shlex.quote(c) for c in line), "/dev/null"]
    return subprocess.run(line, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_a_cluster_run_typed_in_srun_pty_bash_is_submitted(tmp_path):
    res = _in_step(["-N1", "-n1"], [sys.executable, "-m", "hpcgnn", "+cluster=devcluster", *TINY,
                                    f"dataset.root={DATA_ROOT}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, pty=True)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "a one-task interactive SLURM step (SLURM_PTY_PORT is set (srun --pty)): submitting to devcluster" in out
    job_id = _job_id(out)
    s = _summary(tmp_path)
    assert s["launcher"] == "slurm" and s["job_id"] == job_id and s["hostnames"] == ["n1", "n2"]
    assert _final_state(job_id) == "COMPLETED"


def test_a_local_run_typed_in_a_one_task_step_starts_local_processes(tmp_path):
    """No --pty: srun names the job after what it runs (bash), as Lightning's check expects."""
    res = _in_step(["-N1", "-n1", "--cpus-per-task=2"], [sys.executable, "-m", "hpcgnn", *TINY,
                                                         f"dataset.root={DATA_ROOT}", f"hydra.run.dir={tmp_path / 'run'}"],
                   tmp_path, pty=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "the job is named 'bash' (an interactive shell)): starting 2 local processes" in res.stdout
    s = _summary(tmp_path)
    # the step lands on whichever node SLURM picks (n2 when n1 is still busy): both ranks on that one
    assert s["launcher"] == "torchrun" and s["world_size"] == 2 and len(s["hostnames"]) == 1
    assert s["hostnames"][0] in ("n1", "n2")


def test_a_multi_task_srun_step_still_runs_as_ranks_whatever_the_job_is_called(tmp_path):
    res = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "--job-name=interactive", sys.executable, "-m", "hpcgnn",
                          *TINY, f"dataset.root={DATA_ROOT}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    s = _summary(tmp_path)
    assert s["launcher"] == "slurm" and s["world_size"] == 2 and s["hostnames"] == ["n1", "n2"]
    assert res.stdout.count("test accuracy") == 1


# ------------------------------------------------------------------ sampler servers: one heterogeneous job

def _het_state(job_id: str) -> str:
    """The state of a heterogeneous job's trainers (component +0; sacct lists each component)."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State"], capture_output=True,
                         text=True, check=True).stdout
    states = dict(line.split("|", 1) for line in out.split())
    return states.get(f"{job_id}+0", "")


HET = ["+cluster=devcluster", "cluster.nodes=1", "train.epochs=3", "dataset.num_nodes=20000", "train.batch_size=128",
       "debug.slow_rank=0", "debug.slow_s=0.1", "metrics.tensorboard=false"]


def test_sampler_server_on_n2_preempted_requeued_trains_bitwise_as_in_process(tmp_path):
    """The trainer on n1, its sampler server on n2 (one heterogeneous job), USR2 mid-epoch: the whole job is
    requeued and resumes; the parameters equal those of a plain job that sampled in-process."""
    cut = tmp_path / "het"
    job, log = _submitted_until(cut, "epoch 1/3", *HET, "cluster.samplers.nodes=1")
    text = log.read_text()
    assert re.search(r"1 sampler server\(s\) ready \(n2:\d+\)", text), text  # the trainers' group came first: n1
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    plain = run_cli(*HET, cwd=tmp_path / "plain", timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not (cut / "run" / "summary.json").exists():
        time.sleep(1)
    s, ref = _summary(cut), _summary(tmp_path / "plain")
    assert "(resume 1)" in log.read_text() and s["requeues"] == 1
    assert s["param_checksums"] == ref["param_checksums"]
    # The requeued job is placed afresh (the scheduler may swap the groups' nodes): still one node each.
    served = json.loads((cut / "run" / "metrics" / "sampler-server-0.json").read_text())
    assert served["batches_served"] > 0 and sorted([*s["hostnames"], served["host"]]) == ["n1", "n2"]
    # Where a site refuses heterogeneous jobs: the servers' own job, submitted first, met through the run folder.
    two = run_cli(*HET, "cluster.samplers.nodes=1", "cluster.samplers.het=false", cwd=tmp_path / "two", timeout=600)
    assert two.returncode == 0, two.stdout + two.stderr
    assert re.search(r"submitted the sampler servers' job \d+", two.stdout)
    assert _summary(tmp_path / "two")["param_checksums"] == ref["param_checksums"]
    assert re.fullmatch(r"n[12]:\d+", (tmp_path / "two" / "run" / "servers" / "0").read_text())


def test_a_killed_sampler_server_fails_the_heterogeneous_job_naming_its_node(tmp_path):
    job, log = _submitted_until(tmp_path, "epoch 1/30", *HET, "train.epochs=30", "cluster.samplers.nodes=1")
    server = json.loads((tmp_path / "run" / "metrics" / "sampler-server-0.json").read_text())
    os.kill(server["pid"], 9)  # the dev cluster's nodes are this machine's processes
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120 and _het_state(job) in ("PENDING", "RUNNING", "COMPLETING", ""):
        time.sleep(1)
    assert _het_state(job) == "FAILED"
    assert time.monotonic() - t0 < 90  # within dist.timeout_s (120 s), in fact at once
    report = subprocess.run([sys.executable, "-m", "hpcgnn", "status", str(tmp_path / "run")], capture_output=True,
                            text=True)  # the folder still shows the server
    text = log.read_text() + (tmp_path / "run" / "submitit" / f"{job}_0_log.err").read_text()
    node = server["host"]  # (SLURM puts the servers' component on n1 or n2, the trainers' on the other)
    assert re.search(rf"sampler server 0 at {re.escape(node)}:\d+ closed the connection .* while rank 0 was "
                     r"(waiting for batch \d+|sending to it)", text), text
    assert node in ("n1", "n2") and f"{node}:" in report.stdout


def test_a_tune_is_one_job_array_whose_preempted_worker_resumes_its_trial_bitwise(tmp_path):
    """hpcgnn tune +cluster on a partitioned graph: 8 trials on 2 workers, one job array of 2 elements (a node
    each), every trial on one partition; worker 0 is preempted mid-trial (USR2): requeued, it resumes that trial
    from its checkpoint. Every trial is accounted for, each training as the others do (one learning rate; only the
    straggler warning's factor is drawn, so that no trial repeats another's parameters), and the study's best is
    its best member's."""
    pytest.importorskip("optuna")
    sweep = tmp_path / "sweep"
    res = run_cli("tune", "train.lr=choice(0.01)", "metrics.straggler_factor=interval(1.5, 3.0)", "+cluster=devcluster",
                  "cluster.nodes=1", "train.epochs=3", "graph=partitioned", "graph.method=random", "dataset.seed=7",
                  "dataset.num_nodes=6000", "train.batch_size=128", "debug.slow_rank=0", "debug.slow_s=0.1",
                  "metrics.tensorboard=false", "tune.trials=8", "tune.parallel=2", "tune.pruner=none",
                  f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"job array (\d+), 2 worker\(s\)", res.stdout)
    assert m, res.stdout
    array = m.group(1)
    log = sweep / "submitit" / f"{array}_0_0_log.out"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "epoch 1/3" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    assert "epoch 1/3" in log.read_text()
    first = json.loads((sweep / "workers" / "0.json").read_text())["trial"]
    subprocess.run(["scancel", "--signal=USR2", f"{array}_0"], check=True)
    assert _final_state(f"{array}_0", 600) == "COMPLETED" and _final_state(f"{array}_1", 600) == "COMPLETED"
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import open_study

    study = open_study(compose(["tune.pruner=none"]).cfg, sweep)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 8, [(t.number, t.state.name) for t in trials]
    summaries = [json.loads((sweep / "trials" / str(t.number) / "summary.json").read_text()) for t in trials]
    assert summaries[first]["requeues"] == 1 and summaries[first]["resumes"] == 1
    assert all(s["param_checksums"] == summaries[first]["param_checksums"] for s in summaries)
    assert all(s["graph_mode"] == "partitioned" for s in summaries)
    assert "after partitioning job" in res.stdout  # (dataset.seed=7: a graph no other test partitions)
    best = max(summaries, key=lambda s: s["tune_value"])
    assert study.best_value == best["tune_value"]
