"""The command line (localserve/cli/__init__.py, `python -m localserve`): every subcommand
parses, chat and monitor take the URL the same ways (cli/shared.py), and localserve imports tui
only inside the commands that open it; no model needed."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from localserve import cli
from tests.support.paths import ROOT

COMMANDS = {
    "usage",
    "worker",
    "demo",
    "monitor",
    "chat",
    "serve",
    "generate",
    "models",
    "bench",
    "sweep",
    "bench-engine",
}


# the modules that open tui's apps, and may import tui inside their command functions
OPENS_TUI = {"demo.py", "monitor.py", "chat.py"}


def parser():
    """The whole parser."""
    return cli.build_parser()


def subcommands(p) -> dict:
    return next(a for a in p._actions if a.dest == "==SUPPRESS==" and a.choices).choices


def test_every_command_is_on_the_command_line():
    assert set(subcommands(parser())) == COMMANDS


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_a_help_that_parses(command, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args([command, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: localserve {command}")


def test_no_prefix_cache_on_serve_and_demo():
    p = parser()
    assert p.parse_args(["serve", "--no-prefix-cache"]).no_prefix_cache
    assert p.parse_args(["demo", "--no-prefix-cache"]).no_prefix_cache
    assert not p.parse_args(["demo"]).no_prefix_cache


@pytest.mark.parametrize("command", ["chat", "monitor"])
def test_chat_and_monitor_take_the_url_the_same_ways(command, capsys):
    from localserve.cli.shared import DEFAULT_URL, server_url

    url = "ws://10.0.0.2:9000"
    for argv, expected in [([], DEFAULT_URL), ([url], url), (["--url", url], url)]:
        assert server_url(parser().parse_args([command, *argv])) == expected
    with pytest.raises(SystemExit):  # one or the other
        parser().parse_args([command, url, "--url", url])
    assert "not allowed with" in capsys.readouterr().err


def tui_imports(tree: ast.AST) -> list[ast.stmt]:
    """The import statements under `tree` that import tui or one of its modules."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        if any(n == "tui" or n.startswith("tui.") for n in names):
            found.append(node)
    return found


def test_localserve_imports_tui_only_inside_the_commands_that_open_it():
    cli_dir = ROOT / "localserve" / "cli"
    for path in (ROOT / "localserve").rglob("*.py"):
        tree = ast.parse(path.read_text())
        if path.parent != cli_dir or path.name not in OPENS_TUI:
            assert not tui_imports(tree), path
            continue
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        inside = {id(i) for f in functions for i in tui_imports(f)}
        assert all(id(i) in inside for i in tui_imports(tree)), path


def test_python_m_localserve_lists_every_command(tmp_path):
    """This checkout's command line, run as `python -m localserve`."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}

    def localserve(*argv: str) -> str:
        command = [sys.executable, "-m", "localserve", *argv]
        ran = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        return ran.stdout

    listed = localserve("--help").split("{")[1].split("}")[0].split(",")
    assert set(listed) == COMMANDS
    assert "--url URL" in localserve("monitor", "--help")
    assert "--url URL" in localserve("chat", "--help")
