"""The docs stay honest: every relative link resolves, and every hpcgnn command line in README.md and docs/
composes with the configs shipped, so a renamed key breaks the build, not a user's first try."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from hpcgnn.__main__ import FLAGS, SUBCOMMANDS
from hpcgnn.submit.compose import compose, compose_sweep

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# python -m hpcgnn[.data|.partition] ..., or the console script with a subcommand, a flag or an override
COMMAND = re.compile(r"^(?:\$ )?(?:python -m hpcgnn(?:\.data|\.partition)?(?= |$)|hpcgnn (?:-|\S*=|data |partition |"
                     r"status |report |cluster |predict |export ))")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def test_the_docs_are_the_readme_and_task_pages():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    assert {p.name for p in PAGES} >= {"install.md", "first-run.md", "cluster.md", "datasets.md", "link-prediction.md",
                                       "typed-graphs.md", "partitioned.md", "gpus.md", "sweeps-and-metrics.md",
                                       "faults.md", "benchmarks.md", "architecture.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link to {target}: no {file}"
        if anchor:
            assert file.suffix == ".md" and anchor in _anchors(file), f"{page.name}: link to {target}: no such heading"


def command_lines(page: Path) -> list[str]:
    """The hpcgnn command lines of a page: lines of its code blocks, and inline code, that start with one."""
    text = page.read_text()
    lines = [ln for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) for ln in block.splitlines()]
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [ln.strip() for ln in lines if COMMAND.match(ln.strip())]


CASES = [(page, line) for page in PAGES for line in command_lines(page)]


@pytest.fixture
def user_cluster(tmp_path, monkeypatch):
    """The docs' own cluster (`+cluster=mycluster`) as a user would have it: the example file, copied."""
    (tmp_path / "cluster").mkdir()
    shutil.copy(REPO / "conf" / "cluster" / "example_gpu.yaml", tmp_path / "cluster" / "mycluster.yaml")
    monkeypatch.setenv("HPCGNN_CONFIG_DIR", str(tmp_path))


def test_the_docs_show_commands():
    assert len(CASES) >= 40 and {p.name for p, _ in CASES} >= {"README.md", "first-run.md", "datasets.md"}


@pytest.mark.parametrize("page, line", CASES, ids=[f"{p.name}:{i}" for i, (p, _) in enumerate(CASES)])
def test_every_command_line_composes(page, line, user_cluster):
    """Overrides compose (a sweep: every member) with the configs shipped; subcommands exist."""
    words = [w for w in shlex.split(line, comments=True) if w not in ("...", "$")]
    program, args = words[:3] if words[0] == "python" else words[:1], words[3:] if words[0] == "python" else words[1:]
    module = program[-1] if words[0] == "python" else "hpcgnn"
    if module == "hpcgnn" and args and args[0] in SUBCOMMANDS:
        module, args = f"hpcgnn.{args[0]}", args[1:]
    if module in ("hpcgnn.status", "hpcgnn.report", "hpcgnn.cluster", "hpcgnn.export"):
        return  # (folders and cluster names, not configs: the subcommand exists)
    if module == "hpcgnn.predict":  # a run folder, its options, then overrides of the run's config
        from hpcgnn.submit.predict import parse

        _, options, args = parse(args)
        args = [*args, *(f"predict.{k}={v}" for k, v in options.items() if k in ("what", "split", "mode"))]
    if module == "hpcgnn.data":
        assert args and args[0] in ("prepare", "download"), line
        args = args[1:]
    if module == "hpcgnn.tune":  # a search space: every value it can take composes (nothing written)
        pytest.importorskip("optuna")
        from hpcgnn.submit.tune import plan

        assert plan([a for a in args if not a.startswith("[")])[1]
        return
    flags = {FLAGS[a] for a in args if a in FLAGS}
    overrides = [a for a in args if a not in FLAGS and not a.startswith(("[", "+tune.best="))]  # (a user's file)
    assert not [a for a in overrides if a.startswith("-")], f"{page.name}: unknown option in {line}"
    if "multirun" in flags:
        assert compose_sweep(overrides)
    else:
        assert compose(overrides).cfg


def _layout(page: Path) -> list[str]:
    """The paths a page's layout names (the indented lines of its "Layout, in the order data flows")."""
    text = page.read_text()
    section = text.split("Layout, in the order data flows", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"(?m)^ {4}(\S+)", section)


def test_the_layout_matches_the_tree():
    """README's layout names every folder of the package, and the architecture page every module and folder:
    each named path exists, and nothing of the tree is left out."""
    folders = {f"hpcgnn/{p.name}/" for p in (REPO / "hpcgnn").iterdir() if (p / "__init__.py").exists()}
    readme = set(_layout(REPO / "README.md"))
    assert all((REPO / p).exists() for p in readme) and folders <= readme, folders - readme
    named = _layout(REPO / "docs" / "architecture.md")
    top = {p for p in named if p.startswith("hpcgnn/")}
    assert all((REPO / p).exists() for p in top), [p for p in top if not (REPO / p).exists()]
    modules = {f"hpcgnn/{p.name}" for p in (REPO / "hpcgnn").glob("*.py") if p.name != "__init__.py"}
    assert modules | folders <= top, (modules | folders) - top
    for folder in ("submit", "rank"):  # their modules, one per line under the folder
        files = {p.name for p in (REPO / "hpcgnn" / folder).glob("*.py") if p.name != "__init__.py"}
        listed = set(re.findall(r"\b(\w+\.py)\b", (REPO / "docs" / "architecture.md").read_text()))
        assert files <= listed, files - listed
