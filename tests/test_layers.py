"""The package layering, read from the source tree with `ast` (no module is imported to check it).

- The SDK (sdk/aegis) imports nothing from the agent or the apps: front ends plug into the SDK (``aegis.commands``
  entry points), never the other way; `tools/` imports nothing from `tests/`.
- No import cycles between the SDK's packages: each sdk/aegis/<pkg>/ folder and each top-level module is a node, an
  edge is an ``import`` of another node anywhere in a file. Two graphs are checked: module-level imports only (what
  runs on ``import``), and all imports including those inside functions (the architecture: a lazy import is still a
  dependency).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SDK = REPO / "sdk" / "aegis"

Edge = tuple[str, str]
Site = tuple[str, int, bool]  # (file relative to sdk/aegis, line, inside a function)


@cache
def _imports(path: Path, module: str) -> list[tuple[str, int, bool]]:
    """(imported name, line, inside a function) of every import in ``path`` (module ``module``): ``import a.b``
    gives ``a.b``, ``from a import b`` gives ``a.b`` (a submodule or a name in ``a``), relative imports resolved."""
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - child.level + 1]
                    target = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    target = child.module or ""
                out.extend((target if a.name == "*" else f"{target}.{a.name}", child.lineno, inside)
                           for a in child.names)
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _sdk_nodes() -> frozenset[str]:
    return frozenset(
        [p.name for p in SDK.iterdir() if (p / "__init__.py").is_file()] + [p.stem for p in SDK.glob("*.py")]
    )


def _node(module: str) -> str | None:
    """The graph node of an ``aegis...`` module name: its package or top-level module ('aegis' for the root)."""
    parts = module.split(".")
    if parts[0] != "aegis":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in _sdk_nodes() else "aegis"


@cache
def _sdk_edges() -> dict[Edge, tuple[Site, ...]]:
    """Edges between the SDK's nodes, each with the import statements that make it."""
    edges: dict[Edge, list[Site]] = defaultdict(list)
    for path in sorted(SDK.rglob("*.py")):
        module = _module_name(path, SDK.parent)
        src = _node(module)
        for target, line, inside in _imports(path, module):
            dst = _node(target)
            if dst is not None and dst != src:
                edges[(src, dst)].append((str(path.relative_to(SDK)), line, inside))
    return {k: tuple(v) for k, v in edges.items()}


def _cycles(edges: set[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def _explain(cycles: list[list[str]], edges: dict[Edge, tuple[Site, ...]]) -> str:
    lines = []
    for component in cycles:
        lines.append(" <-> ".join(component))
        for (a, b), sites in sorted(edges.items()):
            if a in component and b in component:
                where = ", ".join(f"{f}:{n}{' (in a function)' if inside else ''}" for f, n, inside in
                                  sorted(set(sites))[:3])
                lines.append(f"  {a} -> {b}: {where}")
    return "\n".join(lines)


def test_the_graph_is_read() -> None:
    """The checker sees the SDK's real edges (a graph with no edges would pass every test below)."""
    edges = _sdk_edges()
    assert ("supervise", "train") in edges and ("cli", "planning") in edges
    assert any(not inside for sites in edges.values() for *_, inside in sites)
    assert any(inside for sites in edges.values() for *_, inside in sites)
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


def test_no_cycles_between_packages_at_module_level() -> None:
    edges = {e: s for e, s in _sdk_edges().items() if any(not inside for *_, inside in s)}
    cycles = _cycles(set(edges))
    assert not cycles, "import cycles at module level:\n" + _explain(cycles, edges)


def test_no_cycles_between_packages() -> None:
    """All imports, those inside functions too."""
    edges = _sdk_edges()
    cycles = _cycles(set(edges))
    assert not cycles, "import cycles (imports inside functions count):\n" + _explain(cycles, edges)


def _module_edges(package: str) -> dict[Edge, tuple[Site, ...]]:
    """Edges between the modules of one SDK package (``aegis.data``), and from them to other top-level nodes."""
    edges: dict[Edge, list[Site]] = defaultdict(list)
    root = SDK / package
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, SDK.parent)
        src = module.split(".")[2] if module.count(".") >= 2 else package
        for target, line, inside in _imports(path, module):
            parts = target.split(".")
            if parts[:2] == ["aegis", package] and len(parts) > 2 and (root / parts[2]).with_suffix(".py").is_file():
                dst = parts[2]
            else:
                dst = _node(target)
            if dst is not None and dst != src:
                edges[(src, dst)].append((str(path.relative_to(SDK)), line, inside))
    return {k: tuple(v) for k, v in edges.items()}


def test_the_data_layer_has_no_cycle() -> None:
    """The data layer (``aegis.data``) is one direction, bottom to top: reading rows (reading) -> rendering
    (render) -> token counting for plans (tokenizers) -> dataset statistics (profile); the engine's examples and
    batches (train.data) render through it. No edge runs the other way."""
    order = ["reading", "render", "tokenizers", "profile"]
    edges = _module_edges("data")
    above = {a: {"train", *order[order.index(a) + 1:]} for a in order}
    upward = [(a, b) for a, b in edges if b in above.get(a, ())]
    assert not upward, "the data layer imports upward:\n" + "\n".join(
        f"  {a} -> {b}: " + ", ".join(f"{f}:{n}" for f, n, _ in sorted(set(edges[a, b]))[:3]) for a, b in sorted(upward)
    )
    assert ("profile", "render") in edges and ("tokenizers", "render") in edges  # the graph is the real one
    assert ("train", "data") in _sdk_edges()
    cycles = _cycles(set(edges))
    assert not cycles, "import cycles:\n" + _explain(cycles, edges)


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_sdk_imports_no_agent_or_app() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in _python_files(SDK)
        for target, line, _ in _imports(path, _module_name(path, SDK.parent))
        if target.split(".")[0] in {"aegis_agent", "aegis_apps"}
    ]
    assert not offenders, "\n".join(offenders)


def test_tools_import_nothing_from_tests() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in _python_files(REPO / "tools")
        for target, line, _ in _imports(path, _module_name(path, REPO))
        if target.split(".")[0] == "tests"
    ]
    assert not offenders, "\n".join(offenders)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """The import reader finds what the tests above look for: plain, from-, relative and in-function imports."""
    pkg = tmp_path / "aegis" / "x"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text(
        "import aegis_apps.launchers\nfrom . import y\nfrom ..z import w\n\ndef f():\n    from tests.hf_folders import corpus\n"
    )
    found = _imports(pkg / "m.py", "aegis.x.m")
    assert ("aegis_apps.launchers", 1, False) in found
    assert ("aegis.x.y", 2, False) in found and ("aegis.z.w", 3, False) in found
    assert ("tests.hf_folders.corpus", 6, True) in found


# ----- the front ends plug in through entry points --------------------------------------------------------------


@pytest.fixture
def fresh_app(monkeypatch: pytest.MonkeyPatch):
    """`aegis.cli`'s typer app with only the planner's commands, so mounting can be watched."""
    import typer

    import aegis.cli as cli

    app = typer.Typer(add_completion=False)
    monkeypatch.setattr(cli, "app", app)
    return cli, app


def _mounted(app) -> dict[str, str]:
    return {c.name: c.callback.__module__ for c in app.registered_commands}


def test_chat_and_slack_are_entry_points_of_the_apps(fresh_app) -> None:
    from importlib.metadata import entry_points

    cli, app = fresh_app
    declared = {ep.name: ep.value for ep in entry_points(group=cli.COMMANDS_GROUP)}
    assert declared == {"chat": "aegis_apps.launchers:chat", "slack": "aegis_apps.launchers:slack"}
    cli._mount_run_commands()
    mounted = _mounted(app)
    assert mounted["chat"] == mounted["slack"] == "aegis_apps.launchers" and mounted["run"] == "aegis.cli.supervised"


@pytest.mark.parametrize("declared", [False, True], ids=["apps-not-installed", "apps-extra-missing"])
def test_without_the_apps_the_stand_ins_say_what_to_install(fresh_app, monkeypatch, declared: bool) -> None:
    """No distribution declares the commands, or the declared module cannot be imported: `aegis chat` is listed
    and says in one line which extra to install."""
    import importlib.metadata

    from typer.testing import CliRunner

    cli, app = fresh_app
    eps = importlib.metadata.EntryPoints(
        [importlib.metadata.EntryPoint(n, f"aegis_apps_absent.cli:{n}", cli.COMMANDS_GROUP) for n in ("chat", "slack")]
        if declared else []
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: eps)
    cli._mount_run_commands()
    result = CliRunner().invoke(app, ["--help"])
    assert "not installed: pip install 'aegis-ml[apps]'" in result.output
    result = CliRunner().invoke(app, ["chat", "--port", "1"])
    assert "`aegis chat` needs the 'apps' extra" in str(result.exception)
    assert "pip install 'aegis-ml[apps]'" in str(result.exception)


def test_aegis_plan_imports_no_app_or_supervisor() -> None:
    import subprocess

    code = (
        "import sys; from aegis.cli import main\n"
        "try: main(['plan', 'qlora llama-3.1-8b on 3090', '--json'])\nexcept SystemExit: pass\n"
        "print(sorted(m for m in ('aegis_apps', 'aegis_agent', 'aegis.supervise', 'jax', 'gradio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_supervisor_finds_the_quantizer_through_its_entry_point() -> None:
    """Every ``quantize`` method a run config accepts has a model wrapper, found without supervise importing forge."""
    import typing

    from aegis.supervise.run_config import QuantizeSection, RunConfig
    from aegis.supervise.engine_handle import _quantize_wrapper

    from aegis.forge.bitnet_train import BitNetModel

    methods = typing.get_args(QuantizeSection.model_fields["method"].annotation)
    assert methods == ("bitnet_b158",)
    for method in methods:
        cfg = RunConfig(model="tiny-llama", data="toy", quantize={"method": method, "keep_layers": (1,)})
        wrap = _quantize_wrapper(cfg)
        inner = type("Inner", (), {"spec": type("Spec", (), {"moe": None})()})()
        model = wrap(inner)
        assert isinstance(model, BitNetModel) and model.inner is inner and model.keep_layers == (1,)
    assert _quantize_wrapper(RunConfig(model="tiny-llama", data="toy")) is None


def test_a_quantizer_without_an_entry_point_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from aegis.errors import MissingExtraError
    from aegis.supervise.run_config import RunConfig
    from aegis.supervise.engine_handle import _quantize_wrapper

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: importlib.metadata.EntryPoints([]))
    with pytest.raises(MissingExtraError, match="bitnet_b158 has no installed implementation.*reinstall aegis-ml"):
        _quantize_wrapper(RunConfig(model="tiny-llama", data="toy", quantize="bitnet_b158"))


def test_the_sdk_top_level_is_the_architecture() -> None:
    """sdk/aegis reads as the design: packages for model knowledge, data, planning, the engine, runs, forge and the
    commands; beside them only modules every layer shares (schema's recipe, errors, units, the output-folder rule).
    A new loose module belongs in one of the packages."""
    packages = {p.name for p in SDK.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in SDK.glob("*.py")}
    assert packages == {"models", "data", "planning", "train", "supervise", "forge", "cli", "schema"}
    assert modules == {"__init__", "recipe", "errors", "units", "access", "_extras", "_outdir", "_validation"}


def test_no_two_sdk_modules_share_a_name() -> None:
    """One name per concept: two modules called ``cli.py`` or ``config.py`` in different packages read as one."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in _python_files(SDK):
        if path.name not in {"__init__.py", "__main__.py"}:
            seen[path.name].append(str(path.relative_to(SDK)))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, twice
