"""The library's imports read top-down: no module imports, directly or through others, a module that imports it,
and no package imports a package above it in :data:`LAYERS`, the order in which a step's parts build on each other.

Every import counts, including those inside functions (a lazy import still ties the two modules together).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_rl"

# Lowest first. A module may import its own layer and those below it. The package root (``grpo_rl/__init__.py``)
# stands outside the order: every submodule import runs it; it sets the OpenMP and oneDNN defaults and then imports
# the Python API it exports (``from grpo_rl import Trainer``), the top layer (test_root_imports_only_the_api).
LAYERS = (
    ("grpo_rl.errors", "grpo_rl.quiet", "grpo_rl.trace"),  # what every layer may raise, silence or trace
    ("grpo_rl.config",),  # the schema and pure checks of its values
    ("grpo_rl.algo",),  # loss, objectives, advantages, engine corrections, overlong shaping
    ("grpo_rl.model",),  # loading, log-probs, vocabulary passes, packing, LoRA, compile, precision, optimizer
    ("grpo_rl.placement",),  # devices per role, threads, Ray resources: the run context
    ("grpo_rl.engines",),  # rollout engines behind one protocol
    ("grpo_rl.envs",),  # tasks: environments, data, rewards, tools, multi-turn episodes
    ("grpo_rl.rollout",),  # collector, rollout sources, dynamic sampling, evaluation
    ("grpo_rl.training",),  # learner, reference, the step's stages
    ("grpo_rl.weights",),  # weight transports behind one protocol
    ("grpo_rl.distributed",),  # Ray actors, buffer, pipeline, learner groups, sharding
    ("grpo_rl.run",),  # preflight, roles, the one loop, lifecycle, checkpoints, logs
    ("grpo_rl.cli",),  # command-line tools
    ("grpo_rl.api",),  # the Python API
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``{module: {grpo_rl modules it imports}}``; ``from pkg import name`` counts ``pkg.name`` if it is a module."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # grpo_rl.x.attr -> grpo_rl.x
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):  # a package's own __init__
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_sees_function_level_imports():
    graph = import_graph()
    assert "grpo_rl.algo.loss" in graph["grpo_rl.training.learner"]
    assert len(graph) > 30


def layer_of(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if any(module == top or module.startswith(top + ".") for top in layer):
            return i
    raise KeyError(module)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a module in a higher layer (the package root excepted)."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a != "grpo_rl"
        for b in targets
        if b != "grpo_rl" and layer_of(b) > layer_of(a)
    )


def test_every_module_has_a_layer():
    for module in import_graph():
        if module != "grpo_rl":
            layer_of(module)


def test_no_package_imports_one_above_it():
    assert upward_imports(import_graph()) == []


def test_upward_import_finder_finds_one():
    graph = {"grpo_rl.algo.loss": {"grpo_rl.run.loop"}, "grpo_rl.run.loop": {"grpo_rl.algo.loss", "grpo_rl"}}
    assert upward_imports(graph) == ["grpo_rl.algo.loss -> grpo_rl.run.loop"]


def test_top_of_the_package_stays_small():
    entries = [p for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 20, sorted(p.name for p in entries)


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_says_what_it_holds_and_may_import():
    for layer in LAYERS:
        for top in layer:
            init = PACKAGE.parent.joinpath(*top.split("."), "__init__.py")
            if init.exists():  # a package, not a module
                doc = ast.get_docstring(ast.parse(init.read_text())) or ""
                assert "import" in doc and len(doc.splitlines()) >= 3, top


def test_root_imports_only_the_api():
    assert import_graph()["grpo_rl"] == {"grpo_rl.api", "grpo_rl.envs.rewards.custom"}
