"""Each dataset is declared once (hpcgnn/specs/datasets.py): its yaml, the docs and every registry follow its spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcgnn import checks, data
from hpcgnn.specs import datasets

REPO = Path(__file__).resolve().parent.parent


def _yaml_names(root: Path = REPO) -> dict[str, str]:
    return {p.name: yaml.safe_load(p.read_text())["name"] for p in sorted((root / "conf" / "dataset").glob("*.yaml"))}


def _without_spec(root: Path = REPO) -> dict[str, str]:
    return {f: n for f, n in _yaml_names(root).items() if n not in datasets.SPECS}


def test_every_dataset_yaml_names_a_spec_and_every_spec_has_a_yaml():
    names = _yaml_names()
    assert _without_spec() == {}
    assert set(datasets.SPECS) - set(names.values()) == set()
    for spec in datasets.SPECS.values():  # its own file, of its own name
        assert names.get(f"{spec.name}.yaml") == spec.name


def test_docs_name_every_dataset():
    text = (REPO / "docs" / "datasets.md").read_text()
    assert [n for n in datasets.SPECS if f"`{n}`" not in text] == []


def test_the_registries_are_the_specs():
    node = {s.name for s in datasets.SPECS.values() if "node" in s.tasks}
    link = {s.name for s in datasets.SPECS.values() if "link" in s.tasks}
    assert set(data.LOADERS) == node == set(checks.NODE_DATASETS)
    assert set(data.LINK_LOADERS) == link == set(checks.LINK_DATASETS)
    assert set(data.TYPED_LOADERS) == set(data.TYPED_SOURCES) == {n for n, s in datasets.SPECS.items() if s.typed}
    for s in datasets.SPECS.values():  # a link dataset is split here, or comes with its own split: not both
        assert ("link" in s.tasks) == (s.split_edges or s.link is not None), s.name
        assert s.split_edges <= (s.graph is not None), s.name
        assert "node" not in s.tasks or s.graph or s.typed, s.name


@pytest.mark.parametrize("name", sorted(datasets.SPECS))
def test_every_key_field_is_a_dataset_setting(name):
    fields = set(datasets.DatasetConfig.variant(name).__dataclass_fields__)  # (its source's settings)
    assert set(datasets.spec(name).key) <= fields


def test_a_yaml_without_a_spec_is_named(tmp_path):
    """What the first test reports when someone adds conf/dataset/NEW.yaml and forgets the spec."""
    folder = tmp_path / "conf" / "dataset"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text("name: mine\n")
    (folder / "synthetic.yaml").write_text("name: synthetic\n")
    assert _without_spec(tmp_path) == {"mine.yaml": "mine"}


def test_each_yaml_names_its_sources_schema_and_a_users_own_composes(tmp_path, monkeypatch):
    """A dataset's settings are its source's class: its yaml names that schema (base_dataset_<source>), and a yaml
    of the user's own naming it composes into that class, another source's key refused."""
    from conftest import make_config

    from hpcgnn.errors import ConfigError

    for path in sorted((REPO / "conf" / "dataset").glob("*.yaml")):
        y = yaml.safe_load(path.read_text())
        assert y["defaults"][0] == f"base_dataset_{datasets.spec(y['name']).source}", path.name
    folder = tmp_path / "mine" / "dataset"
    folder.mkdir(parents=True)
    (folder / "mygraph.yaml").write_text(f"defaults:\n  - base_dataset_files\nname: files\npath: {tmp_path}\n")
    monkeypatch.setenv("HPCGNN_CONFIG_DIR", str(tmp_path / "mine"))
    cfg = make_config("dataset=mygraph")
    assert type(cfg.dataset) is datasets.FilesConfig and cfg.dataset.path == str(tmp_path)
    (folder / "wrong.yaml").write_text("defaults:\n  - base_dataset_files\nname: files\nnum_nodes: 5\n")
    with pytest.raises(ConfigError, match=r"^In 'dataset/wrong': ConfigKeyError raised while composing config: Key "
                                          r"'num_nodes' not in 'FilesConfig'$"):  # (one line)
        make_config("dataset=wrong")
