"""The house's import graph: no circle anywhere in hpcgnn/, and no module importing from a layer above its own.

Read from the source (every ``import`` statement, function-local ones too), not from what a process happens to
load, so a circle hidden behind a lazy import is seen as well.
"""

from __future__ import annotations

import ast

from conftest import REPO

# The layers, bottom first: a module may import its own layer and those below. The top-level modules (errors,
# env, config, rng, trust, ...) and the package's own ``__init__`` are the ground floor; commands (``__main__``)
# stand above everything, and so do the package's public names, which load what they name when first used.
LAYERS = ("", "kernels", "data", "partition", "sampling", "models", "stores", "tasks", "rank", "submit")


def import_graph() -> dict[str, set[str]]:
    """Module -> the hpcgnn modules it imports: ``from pkg import name`` is an arrow to ``pkg`` (its __init__ runs)
    and to ``pkg.name`` where that is a submodule; ``import pkg.mod as mod`` to ``pkg.mod`` alone."""
    root = REPO / "hpcgnn"
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        tree = ast.parse(path.read_text())
        # The package's own __init__: its public names load what they name when first used (lazily, in
        # __getattr__), so only what it imports at once counts.
        for node in (tree.body if name == "hpcgnn" else ast.walk(tree)):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
                out.add(base)  # (a name from a package runs the package's __init__ first, a submodule's too)
                out.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
            elif isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
        graph[name] = {m for m in out if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[-1] == "__main__":
        return len(LAYERS)  # the commands: the top
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else 0


def test_hpcgnn_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 70 and "hpcgnn.sampling.neighbor" in graph["hpcgnn.sampling.loader"]  # the graph is read
    assert circles(graph) == []


def test_no_module_imports_from_a_layer_above_its_own():
    """stores never import rank or submit; sampling never imports stores, rank or submit; and so on down."""
    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                    if layer(b) > layer(a) and a != "hpcgnn")  # (its public names load what they name, lazily)
    assert upward == []


def test_the_checks_see_a_circle_and_an_upward_import():
    """The checks themselves can fail: a circle and an upward arrow made by hand are found."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("hpcgnn.stores.base") > layer("hpcgnn.sampling.server") > layer("hpcgnn.trust")
    assert layer("hpcgnn.partition.__main__") > layer("hpcgnn.submit.launch") > layer("hpcgnn") == 0


def task_reads(source: str) -> list[int]:
    """The lines of ``source`` that read the run's task settings (``<anything>.task``)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.Attribute) and node.attr == "task"})


def test_no_store_or_sampling_module_reads_the_task():
    """A store holds the graph and nothing of a task: no module of hpcgnn/stores/ or hpcgnn/sampling/ reads
    ``cfg.task`` (a task's items, hpcgnn/tasks/items.py, say what a step's seeds are and the sampler around them).
    The check can fail: a read made by hand is found."""
    assert task_reads("def f(cfg):\n    return cfg.task.name == 'edge'\n") == [2]
    found = [f"{path.relative_to(REPO)}:{line}" for folder in ("stores", "sampling")
             for path in sorted((REPO / "hpcgnn" / folder).rglob("*.py")) for line in task_reads(path.read_text())]
    assert found == []


def test_every_package_folder_is_in_the_wheel():
    """pyproject.toml lists the packages a wheel carries: a folder of hpcgnn/ left out of the list installs without
    its modules (the kernels package was, until tests/test_install.py's wheel failed to import it)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "hpcgnn").rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)
