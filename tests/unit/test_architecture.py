"""The package's shape: imports point down the layers, never up, and never in a cycle;
the wire path imports without torch.

Layers, lowest first: the client package lad_client (clients/python: the wire vocabulary,
the wire schemas, the clients; it imports nothing of the service, so it installs alone; its route
table is the server's too); the profile schema and stores; the engine (model-agnostic core);
the model families; the service's building blocks (settings, errors, decode, metrics)
beside the evaluation, the demo and the test models; the service; the HTTP routes; the
entry points; the developer tools outside the package. Every import, lazy ones inside
functions included, is an edge.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (ROOT, ROOT / "clients" / "python")
"""Where the packages live: app and calibration_store at the top, lad_client under clients/."""
LAYERS: list[tuple[str, ...]] = [
    ("lad_client",),
    ("calibration_store",),
    ("app.engine",),
    ("app.models",),
    (
        "app.settings",
        "app.cli_help",
        "app.errors",
        "app.budget",
        "app.metrics",
        "app.request_metrics",
        "app.collectors",
        "app.logs",
        "app.demo",
        "app.eval",
        "app.testing",
    ),
    ("app.service",),
    ("app.api",),
    ("app.main", "app.cli", "app.bench", "app.serve"),
    ("tools",),  # developer tools (the generated documentation blocks), never imported by app
]


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    packages = [
        (ROOT, "app"),
        (ROOT, "calibration_store"),
        (ROOT, "tools"),
        (SOURCE_ROOTS[1], "lad_client"),
    ]
    return {
        _module_name(f, root): f
        for root, package in packages
        for f in root.glob(f"{package}/**/*.py")
    }


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file (``from a import b`` names a.b if a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules}


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    if module in ("app", "app.api.routes"):
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


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_the_wire_path_and_the_app_factory_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import lad_client, lad_client.types, app.service.decode, app.errors, app.settings\n"
        "import app.engine.labels, app.engine.methods, app.engine.calibrate, app.main\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
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
