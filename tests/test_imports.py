"""The package's modules form layers (`docs/architecture.md`, "Layers"): each imports only from
its own layer and the layers below it, and there is no import cycle, counting imports inside
functions too. Imports under `if TYPE_CHECKING:` never run and may name any layer."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "replicas"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skipped]


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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


def test_no_import_cycles():
    assert cycles(import_graph()) == []


# Bottom first; the top-level module or package of `replicas` each layer holds (the table in
# docs/architecture.md, in the same order).
LAYERS: list[tuple[str, set[str]]] = [
    ("values", {"errors", "limits", "shapes", "layout", "name_table", "npz", "caching"}),
    ("program", {"hlo"}),
    ("records", {"records"}),
    ("tuning", {"tuning"}),
    ("kernels", {"ops"}),
    ("transport", {"transport"}),
    ("communication", {"collectives", "channels"}),
    ("diagnostics", {"diagnostics"}),
    ("runtime", {"runtime", "cluster"}),
    ("applications", {"jax", "checker", "cli", "__init__"}),
]


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, members) in enumerate(LAYERS):
        if top in members:
            return i
    raise AssertionError(f"{module} is in no layer of LAYERS (docs/architecture.md)")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                  for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m))


def test_every_import_points_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_the_layer_table_is_the_documented_one():
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    rows = [line.split("|")[1].strip() for line in doc.split("## Layers", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith("| layer")]
    assert rows == [name for name, _ in LAYERS]


def test_the_layer_check_sees_an_import_up_a_floor():
    graph = {"replicas.collectives.kernels": {"replicas.runtime.board"}, "replicas.runtime.board": set(),
             "replicas.ops.add": {"replicas.shapes"}, "replicas.shapes": set()}
    assert upward_imports(graph) == ["replicas.collectives.kernels (communication) imports "
                                     "replicas.runtime.board (runtime)"]


def test_the_cycle_finder_sees_function_level_imports():
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(graph) == [["a", "b"]]
    tree = ast.parse("def f():\n    import replicas.shapes\nif TYPE_CHECKING:\n    import replicas.layout\n")
    assert [ast.unparse(n) for n in _runtime_imports(tree)] == ["import replicas.shapes"]


def test_importing_the_runtime_leaves_the_heavy_optional_libraries_out():
    """Every Ray actor imports the runtime when it starts: scipy (one LAPACK kernel), jax (the front
    door) and ray itself on the threads backend are imported where they are used, not at import time."""
    import subprocess
    import sys

    code = ("import sys, replicas, replicas.runtime.driver, replicas.runtime.threads\n"
            "print(sorted(m for m in ('scipy', 'jax', 'ray', 'torch') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=ROOT.parent, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
