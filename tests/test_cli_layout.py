"""The command line lives in cli/, one module per command: no other module imports
argparse, and no module imports another package's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import stepserve
from stepserve.cli import build_parser

SRC = Path(stepserve.__file__).parent
COMMANDS = {"demo", "generate", "models", "serve", "simulate", "bench", "plan", "doctor",
            "sweep", "report", "profile"}


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(SRC.rglob("*.py"))]


def _imports(tree: ast.Module) -> list[tuple[str, str | None]]:
    """(module, name) of every import; name None for `import module`."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name) for a in node.names]
    return out


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def test_only_cli_modules_import_argparse():
    outside = [str(p.relative_to(SRC)) for p, tree in _modules()
               if _package(p) != "cli" and any(m == "argparse" for m, _ in _imports(tree))]
    assert outside == []


def test_no_private_name_is_imported_from_another_package():
    crossing = []
    for path, tree in _modules():
        for module, name in _imports(tree):
            if name and name.startswith("_") and module.startswith("stepserve."):
                theirs = module.split(".")[1] if module.count(".") > 1 else ""
                if theirs != _package(path):
                    crossing.append(f"{path.relative_to(SRC)}: {module}.{name}")
    assert crossing == []


def test_every_command_has_its_module_in_cli():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert set(sub.choices) == COMMANDS
    assert {p.stem for p in (SRC / "cli").glob("*.py")} >= COMMANDS


def test_every_command_prints_its_help():
    """argparse formats help texts with %: a bare "80%" in a setting's help would crash
    `--help` of every command that takes the engine flags."""
    import contextlib
    import io

    import pytest

    from stepserve.cli import main

    for command in sorted(COMMANDS):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ended:
            main([command, "--help"])
        assert ended.value.code == 0, command
        assert "usage:" in out.getvalue(), command
