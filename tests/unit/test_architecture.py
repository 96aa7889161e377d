"""The package's shape: imports point down the layers, never up, and never in a cycle;
the method math imports numpy only; the wire path imports without torch.

Layers, lowest first, as DESIGN.md §3 draws them: the client package lad_client
(clients/python: the wire vocabulary, schemas and route table; it imports nothing of the
service, so it installs alone); the method math on arrays (app.method); the profile schema
and stores (below the engine, which stamps a profile's fingerprint); the torch runtime
(app.engine); the model families; the service's building blocks (settings, errors, the
byte budget, decode); observability (metrics, request metrics, collectors, logs); the
service; the HTTP routes; above them the lab, a package of its own (lad_lab: the demo's
world and training and the test models, then the evaluation and the benchmarks), which the
service never imports; the entry points (app.cli names the lab's modules, imported only
when one of its commands runs); the developer tools outside the packages. Every import,
lazy ones inside functions included, is an edge, and so is an import by string (an import
call's literal, a table of module names such as app.cli's COMMANDS): a module loaded by
name is ordered and checked for circles like one imported by statement.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (ROOT, ROOT / "clients" / "python")
"""Where the packages live: app, calibration_store and lad_lab at the top, lad_client under
clients/."""
LAYERS: list[tuple[str, ...]] = [
    ("lad_client",),
    ("app.method",),
    ("calibration_store",),
    ("app.engine",),
    ("app.models",),
    (
        "app.settings",
        "app.cli_help",
        "app.errors",
        "app.budget",
    ),
    ("app.observability",),
    ("app.service",),
    ("app.api",),
    ("lad_lab.demo", "lad_lab.testing"),
    ("lad_lab.eval", "lad_lab.bench"),
    ("app.main", "app.serve", "app.cli"),
    ("tools",),  # developer tools (the generated documentation blocks), never imported by app
]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    packages = [
        (ROOT, "app"),
        (ROOT, "calibration_store"),
        (ROOT, "lad_lab"),
        (ROOT, "tools"),
        (SOURCE_ROOTS[1], "lad_client"),
    ]
    return {
        _module_name(f, root): f
        for root, package in packages
        for f in root.glob(f"{package}/**/*.py")
    }


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules the file imports anywhere, by statement or by string.

    By statement: ``import a.b`` and ``from a import b`` (a.b where it is a module), lazy
    ones inside functions and TYPE_CHECKING ones included. By string: the literal argument of
    ``importlib.import_module``, ``import_module`` or ``__import__``, and a module's tables of
    modules to import later (a string in a module-level assignment that is a project module's
    dotted name, alone or as ``module:function``: app.cli's COMMANDS, tools.docs' GENERATORS,
    the adapter registry's built-in families, lad_client's lazy homes). Not an import: a
    bare top-level name in a table (``"lad_lab"``: a package app.cli only looks for, a path
    part), nor a string inside a function that no import call takes (``[python, "-m",
    "app.cli"]`` starts another process)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _imports_by_name(node.func) and node.args:
            found.update(_strings(node.args[0]))
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            names = (text.split(":", 1)[0] for text in _strings(statement.value))
            found.update(name for name in names if "." in name)
    return {name for name in found if name in modules}


def _imports_by_name(func: ast.expr) -> bool:
    """``importlib.import_module``, a bare ``import_module`` or ``__import__``."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def _strings(node: ast.AST) -> list[str]:
    """Every string literal in ``node`` (a table's keys and values, nested ones included)."""
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    if module in ("app", "app.api.routes", "lad_lab"):  # package docstrings only
        return len(LAYERS)
    raise AssertionError(f"{module} belongs to no layer; add it to LAYERS")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path, modules) if m != name}
    return graph


def test_every_module_has_a_layer() -> None:
    for module in _graph():
        _layer(module)


def test_no_import_points_up_a_layer() -> None:
    upward = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in _graph().items()
        for b in targets
        if _layer(b) > _layer(a) and b != "app"
    ]
    assert not upward, "\n".join(upward)


KNOWN_CIRCLES: tuple[frozenset[str], ...] = ()
"""Circles the code still has, each to be removed and then dropped here (the test fails
while one is listed that is no longer a circle, or has grown). None: the adapter registry
imports its families, which know nothing of it (issue 40)."""


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The graph's strongly connected groups of more than one module: the modules of each
    group reach one another through imports (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = {stack.pop()}
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _a_cycle(graph: dict[str, set[str]], group: frozenset[str]) -> list[str]:
    """One import path from the group's first module back to itself, inside the group."""
    first = min(group)
    paths = {first: [first]}
    queue = [first]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & group):
            if nxt == first:
                return [*paths[node], first]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"{sorted(group)} is not a circle")


def test_no_import_cycle() -> None:
    """No module reaches itself through imports, string imports included (but for
    KNOWN_CIRCLES, each of which is still a circle and no larger)."""
    graph = _graph()
    circles = _circles(graph)
    found = [
        f"{len(c)} modules: {' -> '.join(_a_cycle(graph, c))}; all: {', '.join(sorted(c))}"
        for c in circles
        if c not in KNOWN_CIRCLES
    ]
    assert not found, "import circles:\n" + "\n".join(found)
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in circles]
    assert not gone, f"no longer circles as listed; update KNOWN_CIRCLES: {gone}"


def test_string_imports_are_edges(tmp_path: Path) -> None:
    """An import by string is an edge like an import statement: an import call's literal,
    and a table of ``module`` or ``module:function`` strings; a string a function only
    passes on (another process's ``-m``) is not."""
    source = tmp_path / "example.py"
    source.write_text(
        "import importlib\n"
        "TABLE = {'a': ('lad_lab.eval.cli:demo_main', 'what it does'), 'b': 'tools.docs'}\n"
        "LOOKED_FOR = ('lad_lab', 'matplotlib')\n"
        "def load():\n"
        "    importlib.import_module('lad_lab.testing.matrix')\n"
        "    __import__('app.models.registry')\n"
        "    return ['python', '-m', 'app.cli', 'app.serve']\n"
    )
    modules = _modules()
    assert _imports(source, modules) == {
        "lad_lab.eval.cli",
        "tools.docs",
        "lad_lab.testing.matrix",
        "app.models.registry",
    }


SERVICE = ("app", "calibration_store", "lad_client")
"""The packages the wheel and the image carry; none of them imports the lab."""


def test_the_service_never_imports_the_lab() -> None:
    """No module of the service imports lad_lab, lazily or not; the lab layers above the
    service, so the layer test already forbids it below the entry points, and this holds
    the entry points too (app.main, app.serve; app.cli names the lab's modules as strings,
    imported only when a lab command runs)."""
    modules = _modules()
    found = sorted(
        f"{name} imports {target}"
        for name, path in modules.items()
        if name.split(".")[0] in SERVICE
        for target in _imported_names(path)
        if target == "lad_lab" or target.startswith("lad_lab.")
    )
    assert not found, found
    assert any(name.startswith("lad_lab.") for name in modules), "the lab was not scanned"


def _file_of(prefix: str) -> str:
    """How the architecture pages name a layer's package or module: app/engine/, errors.py."""
    path = ROOT.joinpath(*prefix.split("."))
    return f"{prefix.split('.')[-1]}.py" if path.with_suffix(".py").is_file() else f"{path.name}/"


def test_the_design_page_draws_these_layers_in_this_order() -> None:
    """docs/design.md's package table names every layer's package, lowest first, and the
    layout of docs/development.md names each of them too."""
    design = (ROOT / "docs" / "design.md").read_text().split("| Layer | Package | Job |")[1]
    rows = [line.split("|")[2] for line in design.splitlines()[2:] if line.startswith("| ")]
    layout = (ROOT / "docs" / "development.md").read_text().split("## Layout")[1]
    drawn: list[tuple[int, str]] = []
    for prefixes in LAYERS[:-1]:  # tools/ sits outside the package
        for prefix in prefixes:
            name = _file_of(prefix)
            where = [i for i, row in enumerate(rows) if f"{name}`" in row]
            assert where, f"docs/design.md's table does not name {name} ({prefix})"
            drawn.append((where[0], prefix))
            assert name in layout, f"docs/development.md's layout does not name {name}"
    assert drawn == sorted(drawn, key=lambda d: d[0]), drawn


def test_the_wire_path_and_the_app_factory_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import lad_client, lad_client.types, app.service.decode, app.errors, app.settings\n"
        "import app.engine.labels, app.method.methods, app.method.calibrate, app.main\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


METHOD_MAY_IMPORT = ("numpy", "lad_client.vocabulary")
"""Beside the standard library and its own modules, all the method math may import: numpy,
and the wire's names of the methods (stdlib only, see the test below)."""


def _imported_names(path: Path) -> set[str]:
    """Every absolute import of a file, lazy and TYPE_CHECKING ones included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.add(node.module or "")
    return names


def test_the_method_math_imports_numpy_and_the_standard_library_only() -> None:
    """app.method is §2.3-2.5 and §2.8-2.10 on arrays: no torch, no model, no store, no I/O
    library, nothing of the service."""
    files = sorted((ROOT / "app" / "method").glob("**/*.py"))
    assert len(files) > 5, files
    foreign = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in _imported_names(path)
        if not (
            name.split(".")[0] in sys.stdlib_module_names
            or name == "app.method"
            or name.startswith("app.method.")
            or any(name == m or name.startswith(m + ".") for m in METHOD_MAY_IMPORT)
        )
    )
    assert not foreign, foreign
    code = (
        "import importlib, pkgutil, sys\n"
        "import app.method\n"
        "for m in pkgutil.walk_packages(app.method.__path__, 'app.method.'):\n"
        "    importlib.import_module(m.name)\n"
        "heavy = ('torch', 'transformers', 'PIL', 'calibration_store', 'app.engine', 'httpx')\n"
        "loaded = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_lad_client_imports_nothing_of_the_service() -> None:
    """The client installs alone (pip install ./clients/python): no app, no store, no model."""
    code = (
        "import sys\n"
        "import lad_client.vocabulary\n"
        "light = sorted(m for m in ('httpx', 'pydantic', 'PIL') if m in sys.modules)\n"
        "assert not light, ('the vocabulary is stdlib only', light)\n"
        "import lad_client, lad_client.types\n"
        "from lad_client import AsyncLadClient, LadClient, LadError, RetryPolicy\n"
        "heavy = ('torch', 'transformers', 'matplotlib', 'numpy', 'fastapi', 'app',\n"
        "         'calibration_store')\n"
        "loaded = sorted(m for m in heavy if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "clients" / "python",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
