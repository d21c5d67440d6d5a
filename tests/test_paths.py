"""The one path rule (hpcgnn/paths.py), walked row by row through docs/security.md's table: for every root and path
it lists, another user's planted attack (a folder others may write, a folder or file another user owns, a link they
made) is refused by the command that would have read or written there, with one line naming the path, and nothing
is written through a planted link. A row without an attack here, or an attack without its row, fails the walk.

The attacker is uid 65534 (nobody): the tests run as root, who may give a file away."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import DATA_ROOT, REPO, TINY, make_config

from hpcgnn import paths, trust
from hpcgnn.errors import ConfigError, NotTrusted

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user takes root")

NOBODY = 65534
TABLE = REPO / "docs" / "security.md"


def table_rows() -> list[str]:
    """The first cell of every row of the table of paths in docs/security.md."""
    text = TABLE.read_text()
    block = text[text.index("| path | what hpcgnn does there |"):]
    rows = []
    for line in block.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip())
    return rows


def foreign(path: Path) -> Path:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return path


def planted_link(at: Path, target: Path) -> Path:
    """A link another user made at ``at``, to ``target`` (one of yours they want written)."""
    at.symlink_to(target)
    return foreign(at)


def cli(capsys, *argv: str) -> tuple[int, str]:
    from hpcgnn.__main__ import main

    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return code, err[0]


def refused_cli(capsys, where: Path, *argv: str) -> None:
    code, line = cli(capsys, *argv)
    assert code == 2 and line.startswith("hpcgnn: not trusted: ") and str(where) in line, line


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from conftest import train_here

    run = tmp_path_factory.mktemp("template") / "run"
    train_here(*TINY, "train.epochs=1", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false", run_dir=run)
    trust.run_secret(run)
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy, symlinks=True)
    return copy


@pytest.fixture
def precious(tmp_path) -> Path:
    """A file of yours that an attacker's link points at: it must stay as it is."""
    p = tmp_path / "precious.txt"
    p.write_text("keep me")
    return p


def _launch(run: Path) -> list[str]:
    return [*TINY, "train.epochs=1", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false", "launch.procs=1",
            f"hydra.run.dir={run}"]


def _tune(tmp_path: Path) -> Path:
    from hpcgnn.io import write_json
    from hpcgnn.submit.compose import compose
    from hpcgnn.tuning import SPEC, WORKERS, open_study

    sweep = tmp_path / "tune"
    sweep.mkdir()
    write_json(sweep / SPEC, {"overrides": [*TINY, "train.lr=choice(0.01,0.02)"], "metric": "val_acc",
                              "direction": "maximize"})
    open_study(compose(TINY).cfg, sweep, "maximize")
    (sweep / WORKERS).mkdir()
    (sweep / "trials").mkdir()
    return sweep


def _load_tune_refused(sweep: Path, where: Path) -> None:
    from hpcgnn.submit.status import tune_status
    from hpcgnn.submit.tune_worker import load_tune

    with pytest.raises(NotTrusted, match=re.escape(str(where))):
        load_tune(sweep)
    said = tune_status(sweep)  # (status only looks: it marks the folder, and prints no command from it)
    assert said.startswith("NOT YOURS: ") and "rerun it" not in said


def _data_refused(cfg_args: list[str], where: Path) -> None:
    from hpcgnn.data.prepared import check_root

    with pytest.raises(NotTrusted, match=re.escape(str(where))):
        check_root(make_config(*cfg_args).dataset)
    check_root(make_config(*cfg_args, "dataset.trust_root=true").dataset)  # (a root your lab controls)


def _prepared(tmp_path: Path) -> tuple[list[str], Path]:
    from hpcgnn.data import prepare

    args = ["dataset.num_nodes=500", f"dataset.root={tmp_path / 'data'}"]
    return args, prepare(make_config(*args).dataset)


# ---------------------------------------------------------------------------- one attack per row of the table


def run_folder(run, precious, capsys, **_):
    run.chmod(0o777)
    refused_cli(capsys, run, "predict", str(run))


def run_overrides(run, capsys, tmp_path, **_):
    marker = tmp_path / "ran"
    overrides = run / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + f"- dataset._target_=os.system\n- +dataset.kwargs.command='touch "
                                                  f"{marker}'\n")
    overrides.chmod(0o666)
    refused_cli(capsys, overrides, "predict", str(run))
    assert not marker.exists()


def run_checkpoints(run, precious, capsys, **_):
    (run / "checkpoints").mkdir(exist_ok=True)
    planted_link(run / "checkpoints" / "step-000000099", precious.parent)
    refused_cli(capsys, run / "checkpoints" / "step-000000099", *_launch(run))


def run_model(run, **_):
    from hpcgnn import load_model

    foreign(run / "model")
    with pytest.raises(NotTrusted, match=rf"{re.escape(str(run / 'model'))} belongs to another user \(uid {NOBODY}\)"):
        load_model(run)


def run_metrics(run, precious, capsys, **_):
    (run / "metrics").chmod(0o777)
    (run / "metrics" / "epochs.jsonl").unlink(missing_ok=True)
    planted_link(run / "metrics" / "epochs.jsonl", precious)
    refused_cli(capsys, run / "metrics", *_launch(run))
    with pytest.raises(NotTrusted, match=r"is a symbolic link: nothing is written through it|can be written by others"):
        paths.open_append(run / "metrics" / "epochs.jsonl", "the epochs' metrics")
    assert precious.read_text() == "keep me"


def run_predict(run, precious, capsys, **_):
    (run / "predict").mkdir(exist_ok=True)
    (run / "predict").chmod(0o777)
    planted_link(run / "predict" / "predictions-test-best", precious.parent)
    refused_cli(capsys, run / "predict", "predict", str(run))
    assert precious.read_text() == "keep me"


def run_recipes(run, **_):
    import hashlib

    from hpcgnn.sampling import shipping

    (run / "recipes").mkdir(mode=0o700, exist_ok=True)
    state = shipping.state_path(run, 0)
    state.write_bytes(b"planted")
    foreign(state)
    with pytest.raises(NotTrusted, match=rf"{re.escape(str(state))} belongs to another user"):
        shipping.fetch(run, 0, hashlib.sha256(b"planted").hexdigest())


def run_secret(run, **_):
    (run / ".secret").unlink()
    os.mkfifo(run / ".secret")
    with pytest.raises(ConfigError, match=r"is a FIFO, not a plain file"):
        trust.run_secret(run)


def sweep_folder(run, tmp_path, capsys, **_):
    from hpcgnn.io import write_json
    from hpcgnn.submit import report
    from hpcgnn.submit.sweep import MANIFEST, status_table

    sweep = tmp_path / "sweep"
    shutil.copytree(run, sweep / "0", symlinks=True)
    write_json(sweep / MANIFEST, {"cluster": None, "members": [{"member": 0, "overrides": ["train.lr=0.1"],
                                                                  "run_dir": str(sweep / "0"), "state": "COMPLETED"}]})
    (sweep / "0").chmod(0o777)
    code = report.main([str(sweep)])
    line = capsys.readouterr().err.strip()
    assert code == 2 and line.startswith("hpcgnn: not trusted: the folder to report on") and str(sweep / "0") in line
    assert status_table(sweep)[0].startswith(f"NOT YOURS: the folder {sweep / '0'} can be written by others")
    assert not (sweep / "sweep.png").exists()


def test_status_looks_at_another_users_folder_without_hanging_on_its_fifos(run, tmp_path):
    """status only looks, also at a colleague's sweep or run (marked NOT YOURS): a FIFO planted where a summary is
    would have made it wait for a writer forever; a link is not followed."""
    import threading

    from hpcgnn.io import write_json
    from hpcgnn.submit.status import run_status
    from hpcgnn.submit.sweep import MANIFEST, status_table

    sweep = tmp_path / "sweep"
    shutil.copytree(run, sweep / "0", symlinks=True)
    write_json(sweep / MANIFEST, {"cluster": None, "members": [{"member": 0, "overrides": ["train.lr=0.1"],
                                                                  "run_dir": str(sweep / "0"), "state": "COMPLETED"}]})
    (sweep / "0" / "summary.json").unlink()
    os.mkfifo(sweep / "0" / "summary.json")
    (sweep / "0" / "progress.json").unlink(missing_ok=True)
    (sweep / "0" / "progress.json").symlink_to("/etc/hostname")
    foreign(sweep / "0" / "summary.json")
    said: list = []
    t = threading.Thread(target=lambda: said.extend([status_table(sweep)[0], run_status(sweep / "0")]), daemon=True)
    t.start()
    t.join(20)
    assert len(said) == 2, "status hung on a FIFO"
    assert said[0].startswith("NOT YOURS: ") and said[1].startswith("no epoch ended yet"), said


def tune_spec(tmp_path, **_):
    from hpcgnn.tuning import SPEC

    sweep = _tune(tmp_path)
    (sweep / SPEC).chmod(0o666)
    _load_tune_refused(sweep, sweep / SPEC)


def tune_study(tmp_path, **_):
    from hpcgnn.tuning import STUDY_FILE

    sweep = _tune(tmp_path)
    (sweep / STUDY_FILE).chmod(0o666)
    _load_tune_refused(sweep, sweep / STUDY_FILE)


def tune_workers(tmp_path, precious, **_):
    from hpcgnn.tuning import WORKERS

    sweep = _tune(tmp_path)
    (sweep / WORKERS).chmod(0o777)
    planted_link(sweep / WORKERS / "0.log", precious)
    _load_tune_refused(sweep, sweep / WORKERS)
    with pytest.raises(NotTrusted):
        paths.open_append(sweep / WORKERS / "0.log", "a worker's log")
    assert precious.read_text() == "keep me"


def tune_trials(tmp_path, run, **_):
    sweep = _tune(tmp_path)
    (sweep / "trials").chmod(0o777)
    planted_link(sweep / "trials" / "1", run)  # (another of your runs: its summary.json would be overwritten)
    _load_tune_refused(sweep, sweep / "trials")


def tune_best(tmp_path, **_):
    from hpcgnn.submit.compose import compose

    best = tmp_path / "best.yaml"
    best.write_text("model=gat\n")
    best.chmod(0o666)
    with pytest.raises(NotTrusted, match=rf"the tune's best overrides {re.escape(str(best))} is a plain file .*mode 0666"):
        compose([f"+tune.best={best}"])
    best.chmod(0o644)
    best.write_text("model=../../elsewhere/evil\n")
    with pytest.raises(ConfigError, match=r"model=../../elsewhere/evil: a config group's value is the name of one of "
                                          r"its options, not a path"):
        compose([f"+tune.best={best}"])


def data_root(tmp_path, **_):
    root = tmp_path / "data"
    root.mkdir()
    root.chmod(0o777)
    _data_refused([f"dataset.root={root}"], root)


def data_pyg(tmp_path, **_):
    root = tmp_path / "data"
    (root / "pyg" / "Planetoid" / "processed").mkdir(parents=True)
    foreign(root / "pyg" / "Planetoid")  # (two levels down: checked before, only the root and pyg/ were)
    _data_refused(["dataset=pyg", "dataset._target_=torch_geometric.datasets.Planetoid", f"dataset.root={root}",
                   "+dataset.kwargs.name=Cora"], root / "pyg" / "Planetoid")


def data_ogb(tmp_path, **_):
    root = tmp_path / "data"
    (root / "ogb" / "ogbn_arxiv" / "raw").mkdir(parents=True)
    (root / "ogb" / "ogbn_arxiv" / "raw").chmod(0o777)
    _data_refused([f"dataset.root={root}"], root / "ogb" / "ogbn_arxiv" / "raw")


def data_prepared(tmp_path, **_):
    args, graph = _prepared(tmp_path)
    foreign(graph / "meta.json")
    _data_refused(args, graph / "meta.json")


def data_edge_targets(tmp_path, precious, **_):
    args, graph = _prepared(tmp_path)
    targets = graph / "edge-targets-0123456789ab"
    targets.mkdir()
    (targets / "edge_label.npy").write_bytes(b"planted labels")
    foreign(targets / "edge_label.npy")  # (labels silently replaced: test accuracy went from 0.54 to 1.0)
    _data_refused(args, targets / "edge_label.npy")


def data_parts(tmp_path, **_):
    args, graph = _prepared(tmp_path)
    (graph / "parts" / "metis-k2-s0").mkdir(parents=True)
    (graph / "parts" / "metis-k2-s0").chmod(0o777)
    _data_refused(args, graph / "parts" / "metis-k2-s0")


def data_files(tmp_path, **_):
    folder = tmp_path / "graph"
    folder.mkdir()
    (folder / "x.npy").write_bytes(b"")
    foreign(folder / "x.npy")
    _data_refused(["dataset=files", f"dataset.path={folder}", f"dataset.root={tmp_path / 'data'}"], folder / "x.npy")


def data_kwargs_root(tmp_path, **_):
    root = tmp_path / "elsewhere"
    (root / "Cora" / "processed").mkdir(parents=True)
    foreign(root / "Cora" / "processed")
    _data_refused(["dataset=pyg", "dataset._target_=torch_geometric.datasets.Planetoid",
                   f"dataset.root={tmp_path / 'data'}", "+dataset.kwargs.name=Cora", f"+dataset.kwargs.root={root}"],
                  root / "Cora" / "processed")


def metrics_group(tmp_path, run, precious, **_):
    from hpcgnn.rank.trackers import MLFLOW_PARENT, Trackers

    pytest.importorskip("mlflow")
    group = tmp_path / "group"
    group.mkdir()
    planted_link(group / MLFLOW_PARENT, tmp_path / "where-they-chose")  # (dangling: MLflow's data went there)
    cfg = make_config(*TINY, "metrics.trackers=[mlflow]", f"metrics.group={group}", run_dir=str(run))
    with pytest.raises(NotTrusted, match=rf"the metrics group's folder \(metrics.group\) {re.escape(str(group))}/"
                                         rf"{MLFLOW_PARENT} is a symbolic link made by another user"):
        Trackers(cfg, True).start()
    assert not (tmp_path / "where-they-chose").exists() and not (group / "mlruns").exists()


def config_folder(tmp_path, monkeypatch, **_):
    from hpcgnn.submit.compose import compose

    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "mine.yaml").write_text("# @package _global_\n")
    foreign(conf / "model" / "mine.yaml")
    monkeypatch.setenv("HPCGNN_CONFIG_DIR", str(conf))
    with pytest.raises(NotTrusted, match=rf"your config folder {re.escape(str(conf / 'model' / 'mine.yaml'))} "
                                         rf"belongs to another user"):
        compose(["model=mine"])


SCENARIOS = {
    "`RUN/`": run_folder,
    "`RUN/.hydra/overrides.yaml`": run_overrides,
    "`RUN/checkpoints/`": run_checkpoints,
    "`RUN/model/`": run_model,
    "`RUN/metrics/`": run_metrics,
    "`RUN/predict/`": run_predict,
    "`RUN/recipes/`": run_recipes,
    "`RUN/.secret`": run_secret,
    "`SWEEP/`": sweep_folder,
    "`TUNE/tune.json`": tune_spec,
    "`TUNE/study.journal`": tune_study,
    "`TUNE/workers/`": tune_workers,
    "`TUNE/trials/`": tune_trials,
    "`TUNE/best.yaml`": tune_best,
    "`DATA/`": data_root,
    "`DATA/pyg/<Name>/`": data_pyg,
    "`DATA/ogb/`": data_ogb,
    "`DATA/prepared/<graph>/`": data_prepared,
    "`DATA/prepared/<graph>/edge-targets-<key>/`": data_edge_targets,
    "`DATA/prepared/<graph>/parts/`": data_parts,
    "`dataset.path`": data_files,
    "`dataset.kwargs.root`": data_kwargs_root,
    "`metrics.group`": metrics_group,
    "`CONFIG/`": config_folder,
    # (rows whose attack is a test of its own module)
    "a model class's package":
        "test_trust.py::test_a_model_class_loads_without_trust_only_from_a_package_only_you_can_write",
    "the C kernels' cache": "test_kernels_load.py::test_a_cache_folder_others_may_write_is_refused",
}


def test_every_row_of_the_table_has_its_attack_and_every_attack_its_row():
    assert table_rows() == list(SCENARIOS)
    for where in [s for s in SCENARIOS.values() if isinstance(s, str)]:
        module, name = where.split("::")
        assert f"def {name}(" in (REPO / "tests" / module).read_text(), where


@pytest.mark.parametrize("row", [r for r, s in SCENARIOS.items() if callable(s)])
def test_a_planted_attack_on_each_path_of_the_table_is_refused(row, request, tmp_path, capsys, monkeypatch, precious):
    needs_run = row.startswith("`RUN/") or row in ("`SWEEP/`", "`TUNE/trials/`", "`metrics.group`")
    run = request.getfixturevalue("run") if needs_run else None
    SCENARIOS[row](run=run, tmp_path=tmp_path, capsys=capsys, monkeypatch=monkeypatch, precious=precious)


def test_the_rule_itself_root_links_and_sticky_folders(tmp_path):
    """The rule's own cases: a link of yours is followed and its target checked; a root's own folders are not
    walked above it; a sticky folder (/tmp) may hold the root."""
    mine = tmp_path / "mine"
    (mine / "a" / "b").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (mine / "a" / "to-elsewhere").symlink_to(elsewhere)
    paths.check_tree(mine, "the folder", "fix it")
    elsewhere.chmod(0o777)
    with pytest.raises(NotTrusted, match=r"the folder \(through the link .*to-elsewhere\) .*elsewhere can be written "
                                         r"by others \(mode 0777\).* HINT: chmod go-w .*elsewhere if nobody else wrote "
                                         r"it; fix it"):
        paths.check_tree(mine, "the folder", "fix it")
    elsewhere.chmod(0o755)
    paths.check_under(mine, mine / "a" / "b" / "not-yet" / "file", "the folder", "fix it")
    with pytest.raises(NotTrusted, match=r"is not inside"):
        paths.check_under(mine, tmp_path / "other", "the folder", "fix it")
    paths.guard_parent(Path("/tmp"))  # (sticky, root's: a run folder may live under it)
    with pytest.raises(NotTrusted, match=r"is a symbolic link made by another user"):
        from hpcgnn.io import write_json

        planted_link(mine / "summary.json", tmp_path / "target")
        write_json(mine / "summary.json", {"a": 1})
    assert not (tmp_path / "target").exists()
    assert json.loads(json.dumps({"ok": True}))["ok"]
