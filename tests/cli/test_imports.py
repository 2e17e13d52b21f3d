"""The project's import graph, read from its source (ast, nothing imported): no import circle, and no
upward import out of the two lower layers.

Every import is an edge: at module level, and inside a function too (a reader following the code
must follow it all the same, and a circle of them only waits for the first module-level one). An
import of `a.b.c` also runs `a/__init__.py` and `a/b/__init__.py`, so it is an edge to those
packages as well, except to the importer's own packages (Python has started them already).

The layering (README, "Architecture"): `storage/` and `corpus/` take from sentsim only its kernel,
`sentsim.errors`, `sentsim.config` and `sentsim.runtime`; `storage/` takes nothing from `corpus/`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sentsim", "corpus", "storage")
# sentsim.runtime: how every process starts or attaches to Ray (a run's ray_dataset starts it as the commands do)
KERNEL = ("sentsim.errors", "sentsim.config", "sentsim.runtime")
LOWER = {"storage": ("storage",), "corpus": ("corpus", "storage")}  # a lower layer -> what it may import


def project_modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def _under_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, mods: dict) -> list[tuple[str, int]]:
    """(project module imported, line) for every import in the file; packages that the import runs on
    the way (their __init__.py) included, the importer's own packages left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    targets: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _under_type_checking(child):  # never runs
                continue
            if isinstance(child, ast.Import):
                targets.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in child.names:  # `from a.b import c`: the module a.b.c if there is one, else a.b
                    sub = f"{base}.{a.name}"
                    targets.append((sub if sub in mods else base, child.lineno))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    edges = []
    for target, line in targets:
        if target.split(".")[0] not in PACKAGES:
            continue
        mod = resolve(target)
        parts = mod.split(".") if mod else []
        for i in range(1, len(parts) + 1):  # the packages on the way, then the module itself
            step = ".".join(parts[:i])
            if step in mods and step != name and not name.startswith(step + "."):
                edges.append((step, line))
    return sorted(set(edges))


def import_graph() -> tuple[dict, dict]:
    mods = project_modules()
    return mods, {name: imports_of(name, path, mods) for name, path in mods.items()}


def circles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_walk_sees_module_and_function_level_imports_and_packages_on_the_way():
    mods, graph = import_graph()
    assert {"sentsim.executor", "storage.store", "corpus.view", "sentsim.harvest.job"} <= set(mods)
    store = dict(graph["storage.store"])
    assert "storage.lease" in store and "storage.records" in store
    # `from sentsim.identity import fingerprint` at module level, `from storage import ShardStore` in a function
    executor = {m for m, _ in graph["sentsim.executor"]}
    assert {"sentsim.identity", "storage", "storage.store"} <= executor
    # a circle made of a function-level import is found
    assert circles({"a": [("b", 1)], "b": [("c", 9)], "c": [("a", 30)], "d": [("a", 2)]}) == [["a", "b", "c"]]


def test_no_import_circle():
    mods, graph = import_graph()
    found = circles(graph)
    lines = []
    for comp in found:
        lines.append("circle: " + ", ".join(comp))
        for a in comp:
            for b, line in graph[a]:
                if b in comp:
                    lines.append(f"  {mods[a].relative_to(ROOT)}:{line} imports {b}")
    assert not found, "\n".join(lines)


def test_storage_and_corpus_import_nothing_from_above_but_the_kernel():
    mods, graph = import_graph()
    upward = []
    for name, edges in graph.items():
        layer = name.split(".")[0]
        if layer not in LOWER:
            continue
        for target, line in edges:
            allowed = target.split(".")[0] in LOWER[layer] or target in KERNEL or target == "sentsim"
            if not allowed:
                upward.append(f"{mods[name].relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "imports from above the lower layers:\n" + "\n".join(upward)


def test_the_bundled_model_has_one_home_and_the_trainers_cli_takes_it_without_rank_targets():
    """The bundled all-MiniLM-L6-v2's path is found in one function (sentsim.bundled_model), which the rank
    targets, the context models and the trainers' command line all use; the command line of `sentsim train`
    reaches it without importing the rank-target code (faiss, sentence-transformers) for a path."""
    mods, graph = import_graph()
    homes = sorted(name for name, path in mods.items()
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                   if isinstance(node, ast.FunctionDef) and node.name == "default_base_encoder")
    assert homes == ["sentsim.bundled_model"], homes
    for user in ("sentsim.training.cli", "sentsim.context.model", "sentsim.rank.targets"):
        assert "sentsim.bundled_model" in {m for m, _ in graph[user]}, user
    assert not [m for m, _ in graph["sentsim.training.cli"] if m.startswith("sentsim.rank")]
    assert not [m for m, _ in graph["sentsim.bundled_model"] if m != "sentsim.errors"]
