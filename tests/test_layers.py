"""The layering holds: imports go one way (cli -> services -> engine/sim -> core and
host -> foundation), and the scheduling core and the simulator load no torch, no web framework
and no plotting library. A new import that breaks either fails here, not in review."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "stepserve"

# rank of each top-level package or module of stepserve: a module may import its own
# rank or lower, never higher
LAYERS = {
    0: {"stepserve", "config"},  # foundation: settings, limits, the user's files
    # scheduling core, workloads, routers, and the host machine (its cores, the threads
    # a step gets, the readings of CPU sharing that engine/, server/, metrics/ and bench/
    # read)
    1: {"core", "workload", "plan", "routing", "host"},
    2: {"engine", "model", "sim", "metrics"},  # the engine core's two runners, measures
    3: {"bench", "sweep", "server", "demo", "profile", "cluster"},  # services
    4: {"cli", "__main__"},  # the command line
}
RANK = {name: rank for rank, names in LAYERS.items() for name in names}
# upward imports that are allowed, each inside a function so it loads only when used
LAZY_EXCEPTIONS = {
    ("stepserve", "engine"): "`from stepserve import LLM` loads the engine when asked",
    ("stepserve", "core"): "`from stepserve import SamplingParams`, loaded when asked",
    ("workload", "model"): "ShareGPT lengths counted with a model's tokenizer, on demand",
}
# the torch-free part: importing all of it must load none of these
HEAVY = ("torch", "fastapi", "starlette", "uvicorn", "matplotlib", "transformers")
LIGHT_PACKAGES = ("core", "sim", "workload", "metrics", "plan", "routing", "host")


def _unit(module: str) -> str:
    """'stepserve.sim.loop' -> 'sim'; 'stepserve' -> 'stepserve'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(stepserve module imported, whether at module level) for every import that runs
    (`if TYPE_CHECKING:` blocks are for type checkers only)."""
    tree = ast.parse(path.read_text())
    checking = {id(n) for stmt in tree.body if isinstance(stmt, ast.If)
                and getattr(stmt.test, "id", "") == "TYPE_CHECKING"
                for n in ast.walk(stmt)}
    top = {id(n) for n in tree.body}
    top |= {id(n) for stmt in tree.body if isinstance(stmt, ast.If) for n in stmt.body}
    found = []
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found += [(n, id(node) in top) for n in names if n.split(".")[0] == "stepserve"]
    return found


def test_every_unit_has_a_layer():
    units = {_unit(name) for name, _ in _modules()}
    assert units <= set(RANK), f"give these a layer: {sorted(units - set(RANK))}"


def test_imports_go_down_the_layers():
    wrong = []
    for name, path in _modules():
        src = _unit(name)
        for target, at_top in _imports(path):
            dst = _unit(target)
            if RANK[dst] <= RANK[src]:
                continue
            if (src, dst) in LAZY_EXCEPTIONS and not at_top:
                continue
            wrong.append(f"{name} imports {target} (layer {RANK[src]} -> {RANK[dst]})")
    assert not wrong, "\n".join(wrong)


def _wrong_imports(src_units: set[str], banned: set[str]) -> list[str]:
    """Imports, lazy ones included, from a module in `src_units` of one in `banned`."""
    return [f"{name} imports {target}" for name, path in _modules()
            if _unit(name) in src_units
            for target, _ in _imports(path) if _unit(target) in banned]


def test_the_core_imports_no_runner_and_no_service():
    """The scheduling core is what the engine and the simulator share: it reaches for
    neither, nor for the model or the server, not even inside a function."""
    wrong = _wrong_imports({"core"}, {"engine", "model", "server", "sim"})
    assert not wrong, "\n".join(wrong)


def test_the_engine_and_the_simulator_do_not_import_each_other():
    """Same scheduler, two runners: what both need lives in core/ (or in a service above
    both, as profile/ does)."""
    wrong = _wrong_imports({"engine"}, {"sim"}) + _wrong_imports({"sim"}, {"engine"})
    assert not wrong, "\n".join(wrong)


def test_only_the_package_entry_points_sit_at_the_top():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert top == ["__init__.py", "__main__.py"], top


def test_the_core_and_the_simulator_load_no_torch_web_or_plotting():
    names = [name for name, _ in _modules() if _unit(name) in LIGHT_PACKAGES]
    assert any(n.startswith("stepserve.sim.") for n in names)
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
