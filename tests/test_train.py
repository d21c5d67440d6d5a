"""Real multi-process training: local spawn, submitit's LocalExecutor, failures, no-wait submission."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from conftest import ACCURACY_BAR, DATA_ROOT, make_config, run_cli, summary_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlp")
    res = run_cli("model=mlp", cwd=folder, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return folder, res


def test_default_run_end_to_end(default_run):
    folder, res = default_run
    s = summary_of(folder)
    assert s["world_size"] == 2 and s["launcher"] == "torchrun" and s["backend"] == "gloo"
    assert s["epochs"] == len(s["history"]) == 8
    assert re.search(r"epoch 8/8 \| loss [\d.]+ \| train acc [\d.]+ \| val [\d.]+ \| test [\d.]+ \| \d+ seeds/s",
                     res.stdout)
    assert f"summary: {folder / 'run' / 'summary.json'}" in res.stdout
    assert s["seeds_per_s"] > 0 and s["wall_time_s"] > 0
    assert 20000 <= s["master_port"] <= 32767
    # train.precision=auto is decided at start, logged with its reason, and the decision recorded
    assert s["precision"] in ("bf16", "fp32")
    assert re.search(rf"train.precision=auto: {s['precision']} \(the CPU has", res.stdout)


@pytest.mark.slow
def test_bf16_and_fp32_train_the_default_to_within_half_a_point(default_run, tmp_path):
    """The default job in the precision auto did not pick (bf16 where the CPU has AMX or AVX512-BF16)."""
    auto = summary_of(default_run[0])
    other = "fp32" if auto["precision"] == "bf16" else "bf16"
    res = run_cli(f"train.precision={other}", "metrics.tensorboard=false", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path)
    assert s["precision"] == other and s["test_acc"] >= ACCURACY_BAR
    assert abs(s["test_acc"] - auto["test_acc"]) <= 0.005, (other, s["test_acc"], auto["test_acc"])


def test_ddp_ranks_end_with_identical_parameters(default_run):
    s = summary_of(default_run[0])
    assert len(s["param_checksums"]) == 2
    assert len(set(s["param_checksums"])) == 1


def test_gnn_beats_mlp_by_a_clear_margin(default_run, mlp_run):
    gnn, mlp = summary_of(default_run[0]), summary_of(mlp_run[0])
    assert gnn["test_acc"] >= ACCURACY_BAR, gnn["test_acc"]
    assert gnn["test_acc"] - mlp["test_acc"] >= 0.15, (gnn["test_acc"], mlp["test_acc"])


def test_submitit_local_executor(tmp_path, tiny_overrides):
    res = run_cli("+cluster=local", *tiny_overrides, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"submitted job \d+ to local \(2 tasks\)", res.stdout)
    s = summary_of(tmp_path)
    assert s["launcher"] == "submitit_local" and s["world_size"] == 2
    assert len(set(s["param_checksums"])) == 1
    assert s["master_port"] == 20000 + int(s["job_id"]) % 12768
    assert list((tmp_path / "run" / "submitit").glob("*_1_log.out"))  # per-task logs
    assert "[rank 0] epoch 2/2" in res.stdout  # rank 0's log followed while waiting


@pytest.mark.parametrize("cluster", [[], ["+cluster=local"]], ids=["spawn", "submitit_local"])
def test_failing_rank_fails_the_run_with_its_traceback(tmp_path, tiny_overrides, cluster):
    t0 = time.monotonic()
    res = run_cli(*cluster, *tiny_overrides, "debug.fail_rank=1", "debug.fail_step=2", cwd=tmp_path, timeout=300)
    assert res.returncode == 1
    assert time.monotonic() - t0 < 200  # bounded: no hang waiting for the dead rank (CI-safe bound, not a timing test)
    assert "RuntimeError: injected failure on rank 1 at step 2 (debug.fail_rank)" in res.stderr
    assert "first failure, rank 1 on " in res.stderr
    # Rank 0 may be listed too (its collective broke), but the cause shown is rank 1's.
    assert re.search(r"failed ranks:\n(  rank 0 on \S+: .*\n)?  rank 1 on \S+: RuntimeError: injected failure",
                     res.stderr)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_ctrl_c_while_waiting_leaves_a_submitted_job_running(tmp_path):
    """Ctrl-C reaches the terminal's whole process group, and submitit's local executor runs the job's tasks as
    children of the command: they inherit an ignored Ctrl-C, so only the waiting stops (before: the tasks died
    with KeyboardInterrupt while the command said the job went on, and the controller printed a traceback)."""
    import os
    import signal
    import subprocess
    import sys

    run = tmp_path / "run"
    with open(tmp_path / "out.txt", "w") as out:  # its own process group, SIGINT not ignored: as in a terminal
        waiting = subprocess.Popen([sys.executable, "-m", "hpcgnn", "+cluster=local", "dataset.num_nodes=4000",
                                    "train.epochs=40", f"dataset.root={DATA_ROOT}", f"hydra.run.dir={run}"],
                                   stdout=out, stderr=out, start_new_session=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and waiting.poll() is None and not (run / "progress.json").exists():
        time.sleep(0.2)
    assert waiting.poll() is None, (tmp_path / "out.txt").read_text()
    os.killpg(waiting.pid, signal.SIGINT)
    assert waiting.wait(60) == 130
    text = (tmp_path / "out.txt").read_text()
    assert re.search(r"stopped waiting; job \d+ goes on", text) and "Traceback" not in text, text
    while time.monotonic() < deadline + 120 and not (run / "summary.json").exists():
        time.sleep(1)
    assert summary_of(tmp_path)["epochs"] == 40


def test_no_wait_returns_job_id_and_folder(tmp_path, tiny_overrides):
    t0 = time.monotonic()
    res = run_cli("+cluster=local", "launch.wait=false", *tiny_overrides, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    m = re.search(r"submitted job (\d+) to local \(2 tasks\); output folder: (\S+)", res.stdout)
    assert m and m.group(2) == str(tmp_path / "run")
    assert "test accuracy" not in res.stdout  # it did not wait
    # The job goes on after the command returned and writes its summary.
    deadline = t0 + 240
    while time.monotonic() < deadline and not (tmp_path / "run" / "summary.json").exists():
        time.sleep(1)
    assert summary_of(tmp_path)["world_size"] == 2


@pytest.mark.parametrize("model", ["gcn", "gat", "gin"])
def test_every_registered_gnn_trains(tmp_path, tiny_overrides, model):
    """One rank, in this process: the trainer with each model of the registry learns."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer

    cfg = make_config(f"model={model}", *tiny_overrides, "train.epochs=5", "train.lr=0.01", f"dataset.root={DATA_ROOT}",
                      "metrics.tensorboard=false", "train.keep_freed_memory=false", run_dir=str(tmp_path / "run"))
    s = Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()
    assert s["model"] == model and s["world_size"] == 1 and s["test_acc"] > 0.3  # 8 classes: chance is 0.125
    assert summary_of(tmp_path)["test_acc"] == s["test_acc"]


def test_torchrun_starts_the_ranks(tmp_path, tiny_overrides):
    """Under torchrun every rank is its own `python -m hpcgnn`; they must share one run folder."""
    import os
    import subprocess
    import sys

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    res = subprocess.run([*torchrun, "-m", "hpcgnn", *tiny_overrides, f"dataset.root={DATA_ROOT}"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    folders = list((tmp_path / "outputs").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("torchrun-")
    s = json.loads((folders[0] / "summary.json").read_text())
    assert s["launcher"] == "torchrun" and s["world_size"] == 2 and len(set(s["param_checksums"])) == 1
    assert res.stdout.count("test accuracy") == 1  # rank 0 alone prints the result


# ------------------------------------------------------------------ preemption, resume, faults

RESUME = ["dataset.num_nodes=4000", "train.epochs=3", "train.batch_size=256", "model.hidden_channels=32"]


# Checkpoints every 2 steps, keeping 2: saving changes no parameter, so this run is also the reference.
PERIODIC = ["checkpoint.every_steps=2", "checkpoint.keep=2"]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> dict:
    """The uninterrupted 2-rank run that interrupted ones must end equal to; it checkpoints periodically."""
    folder = tmp_path_factory.mktemp("whole")
    res = run_cli(*RESUME, *PERIODIC, cwd=folder, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return {**summary_of(folder), "folder": folder}


@pytest.mark.parametrize("graph", [[], ["graph=partitioned", "graph.cache_mb=0.1"]], ids=["replicated", "partitioned"])
def test_preempted_run_resumes_bitwise_identically(tmp_path, graph, whole_run):
    """Rank 1 alone gets the signal mid-epoch; all ranks checkpoint, stop, and the same command resumes."""
    if graph:
        whole = run_cli(*RESUME, *graph, cwd=tmp_path / "whole", timeout=300)
        assert whole.returncode == 0, whole.stdout + whole.stderr
    cut = [*RESUME, *graph, "debug.signal_rank=1", "debug.signal_step=5"]  # 3 steps/epoch: epoch 2, step 2
    first = run_cli(*cut, cwd=tmp_path / "cut", timeout=300)
    assert first.returncode == 3, first.stdout + first.stderr
    assert "preempted: checkpoint of step 5 saved in" in first.stdout
    assert "to resume" in first.stdout and not (tmp_path / "cut" / "run" / "summary.json").exists()
    again = run_cli(*cut, cwd=tmp_path / "cut", timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from" in again.stdout and "epoch 2, step 2 of 3 (resume 1)" in again.stdout
    a, b = (summary_of(tmp_path / "whole") if graph else whole_run), summary_of(tmp_path / "cut")
    assert b["resumes"] == 1 and a["resumes"] == 0
    assert b["param_checksums"] == a["param_checksums"]  # bitwise identical parameters on every rank
    assert [r["loss"] for r in b["history"]] == [r["loss"] for r in a["history"]]


@pytest.mark.parametrize("sampler", ["saint_rw", "cluster"])
def test_preempted_rank_resumes_bitwise_with_samplers_that_hold_state(tmp_path, sampler, cpu_kind):
    """GraphSAINT's counted inclusion probabilities and Cluster-GCN's clusters come back the same after
    a resume: one rank in this process (the trainer itself), preempted mid-epoch, resumed, compared."""
    from conftest import preempted_and_resumed

    whole, again = preempted_and_resumed(*RESUME, f"train.sampler={sampler}", f"dataset.root={DATA_ROOT}",
                                         "metrics.tensorboard=false", step=7, folder=tmp_path)
    assert again["resumes"] == 1 and whole["resumes"] == 0 and again["precision"] == cpu_kind
    assert again["param_checksums"] == whole["param_checksums"]
    assert [r["loss"] for r in again["history"]] == [r["loss"] for r in whole["history"]]


def test_submitit_requeues_and_resumes_by_itself(tmp_path, whole_run):
    """submitit's local executor requeues like SLURM does: one command, interrupted, finishes."""
    res = run_cli("+cluster=local", *RESUME, "debug.signal_rank=0", "debug.signal_step=4", cwd=tmp_path / "cut",
                  timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "asking submitit to requeue the job" in res.stdout and "(resume 1)" in res.stdout
    assert summary_of(tmp_path / "cut")["param_checksums"] == whole_run["param_checksums"]


def test_too_many_timeouts_stop_requeueing_and_say_so(tmp_path):
    # A 1-minute limit makes submitit count any signal as a time-out; none are allowed.
    res = run_cli("+cluster=local", "cluster.time_min=1", "checkpoint.max_timeouts=0", *RESUME,
                  "debug.signal_rank=0", "debug.signal_step=2", cwd=tmp_path, timeout=300)
    assert res.returncode == 1
    assert "Job not requeued because: timed-out too many times" in res.stdout + res.stderr
    assert list((tmp_path / "run" / "checkpoints").glob("step-000000002"))  # the work is saved all the same


def test_slow_start_is_waited_for_but_a_hang_after_the_first_step_fails_within_the_timeout(tmp_path, tiny_overrides):
    """Rank 0 starts 8 s late (the others wait: dist.init_timeout_s holds until the first step); then
    rank 1 hangs at step 2, and rank 0 fails after dist.timeout_s=4, not after the generous one."""
    t0 = time.monotonic()
    res = run_cli(*tiny_overrides, "debug.delay_rank=0", "debug.delay_s=8", "debug.hang_rank=1", "debug.hang_step=2",
                  "dist.timeout_s=4", cwd=tmp_path, timeout=300)
    took = time.monotonic() - t0
    assert res.returncode == 1
    assert took < 150, took  # bounded by the delay, dist.timeout_s and start-up, not by the job's time limit
    assert "collective timeout now 4.0s (dist.timeout_s)" in res.stdout
    assert re.search(r"failed ranks:\n  rank 0 on \S+: .*(timed out|Timed out|timeout)", res.stderr), res.stderr
    assert "4000ms" in res.stderr and "1800000ms" not in res.stderr  # gloo names the timeout it waited


def test_periodic_checkpoints_keep_the_newest(whole_run):
    kept = sorted(p.name for p in (whole_run["folder"] / "run" / "checkpoints").iterdir())
    assert kept == ["step-000000006", "step-000000008"]  # 9 steps: saved at 2, 4, 6, 8
    manifest = json.loads((whole_run["folder"] / "run" / "checkpoints" / kept[-1] / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"common.pt", "rank-0.pt", "rank-1.pt"}


def test_metrics_split_every_step_and_name_the_straggler(tmp_path):
    from hpcgnn.rank.metrics import PHASES

    res = run_cli(*RESUME, "train.epochs=2", "debug.slow_rank=1", "debug.slow_s=0.4", "metrics.progress_bar=on",
                  "metrics.every_steps=1",
                  cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    run = tmp_path / "run"
    for rank in (0, 1):
        records = [json.loads(line) for line in (run / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == list(range(1, 7))  # 3 steps x 2 epochs
        for r in records:
            assert set(PHASES) <= set(r) and all(r[k] >= 0 for k in PHASES)
            assert r["edges"] > 0 and 0 < r["seeds"] <= 256 and r["peak_mem_mb"] > 0
        assert sum(r["seeds"] for r in records[:3]) == 600  # 1200 training nodes over 2 ranks
        if rank == 1:  # the sleep before each step is the slow rank's own time, not a wait for others
            assert min(r["busy_s"] for r in records[1:]) >= 0.4
    epochs = [json.loads(line) for line in (run / "metrics" / "epochs.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2] and len(epochs[-1]["ranks"]) == 2
    s = summary_of(tmp_path)
    bal = s["history"][-1]["balance"]
    assert bal["step_time_max_over_mean"] > 1.2 and bal["edges_cv"] < 0.2
    assert [w["rank"] for w in bal["stragglers"]] == [1]
    assert re.search(r"straggler: rank 1 on \S+: p95 busy step time [\d.]+ s is [\d.]+x the median", res.stdout)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert "epoch 1/2" in res.stderr  # the progress bar (on a terminal it is on by default)


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in open(f"/proc/{pid}/status").read()
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from Linux's /proc."""
    try:
        children = [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL", "SIGINT"])
def test_a_killed_launcher_takes_its_ranks_along(tmp_path, signame):
    """``kill``/``timeout`` (SIGTERM) on a local run stops its ranks through the launcher; SIGKILL, which the
    launcher cannot see, reaches them as their parent-death signal: no orphan ranks keep the graph and cores.
    Ctrl-C (SIGINT to the terminal's whole process group, ranks included) stops the run with one line, no
    traceback, exit 130 (before: the launcher's KeyboardInterrupt traceback, and a second one if the signal
    came twice while it stopped the ranks)."""
    import os
    import signal
    import subprocess
    import sys

    run = tmp_path / "run"
    with open(tmp_path / "out.txt", "w") as out:  # its own process group, SIGINT not ignored: as in a terminal
        launcher = subprocess.Popen([sys.executable, "-m", "hpcgnn", "dataset.num_nodes=4000", "train.epochs=500",
                                     f"dataset.root={DATA_ROOT}", f"hydra.run.dir={run}"], stdout=out, stderr=out,
                                    start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    children: list[int] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and launcher.poll() is None:
        children = _descendants(launcher.pid)  # (the ranks: forked by the fork server the launcher started)
        if len(children) >= 2 and (run / "progress.json").exists():  # the ranks train
            break
        time.sleep(0.2)
    assert launcher.poll() is None and len(children) >= 2, (tmp_path / "out.txt").read_text()
    if signame == "SIGINT":
        os.killpg(launcher.pid, signal.SIGINT)
        time.sleep(0.05)
        os.killpg(launcher.pid, signal.SIGINT)  # impatient: twice
    else:
        os.kill(launcher.pid, getattr(signal, signame))
    launcher.wait(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(c) for c in children):
        time.sleep(0.2)
    left = [c for c in children if _alive(c)]
    for c in left:
        os.kill(c, signal.SIGKILL)
    assert not left, f"orphan ranks after {signame} to the launcher: {left}"
    if signame == "SIGTERM":
        assert launcher.returncode == 143 and "stopped by SIGTERM; stopping its ranks" in (tmp_path / "out.txt").read_text()
    if signame == "SIGINT":
        text = (tmp_path / "out.txt").read_text()
        assert launcher.returncode == 130 and "hpcgnn: the run stopped by Ctrl-C; stopping its ranks" in text, text
        assert "Traceback" not in text, text
