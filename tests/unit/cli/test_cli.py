"""The command line (localserve/cli/__init__.py, `python -m localserve`): every subcommand
parses, chat and monitor take the URL the same ways (cli/shared.py), and localserve imports tui
only inside the commands that open it; the slips answered in one line before anything loads
(an unknown model, --config after the command, a closed pipe) and `models` saying which
configuration it read; no model needed. The slips that need a socket are in
e2e/test_cli_slips.py."""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys

import pytest

from localserve import cli
from localserve.cli import build_parser
from tests.support.cli import localserve, slip_line
from tests.support.paths import ROOT

COMMANDS = {
    "usage",
    "users",
    "worker",
    "demo",
    "monitor",
    "chat",
    "serve",
    "generate",
    "models",
    "pull",
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
    for argv, expected in [
        ([], DEFAULT_URL),
        ([url], url),
        (["--url", url], url),
        (["http://10.0.0.2:9000"], url),  # what `serve` prints
        (["10.0.0.2:9000"], url),
        (["https://chat.example.org/"], "wss://chat.example.org/"),
    ]:
        assert server_url(parser().parse_args([command, *argv])) == expected
    with pytest.raises(SystemExit):  # one or the other
        parser().parse_args([command, url, "--url", url])
    assert "not allowed with" in capsys.readouterr().err


def test_bench_takes_a_temperature_and_refuses_a_negative_one_in_one_line():
    args = parser().parse_args(["bench", "--workload", "edit", "--temperature", "0"])
    assert args.temperature == 0.0 and args.workload == "edit"
    assert parser().parse_args(["bench"]).temperature is None  # each mode's default
    line = slip_line(localserve("bench", "--temperature", "-1"), "--temperature")
    assert line == "localserve: --temperature must be at least 0 (0 = greedy)"


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


@pytest.mark.parametrize("command", ["serve", "demo", "generate"])
def test_an_unknown_model_is_one_line_before_anything_loads(command, tmp_path):
    argv = [command, "--model", "gemma-3-270", *(["hello"] if command == "generate" else [])]
    line = slip_line(localserve(*argv, cwd=tmp_path), "--model", "'gemma-3-270'", "gemma-3-270m")
    assert line == (
        "localserve: --model: unknown model 'gemma-3-270' (models.toml has: gemma-3-270m)"
    )


def test_config_is_taken_before_or_after_the_command(tmp_path):
    assert parser().parse_args(["--config", "a.toml", "models"]).config == "a.toml"
    assert parser().parse_args(["models", "--config", "b.toml"]).config == "b.toml"
    assert parser().parse_args(["serve"]).config is None
    missing = str(tmp_path / "nothere.toml")
    line = slip_line(localserve("serve", "--config", missing), "no such configuration file")
    assert line == f"localserve: {missing}: no such configuration file"


def test_models_says_which_configuration_it_read(tmp_path):
    ran = localserve("models", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("configuration: built-in defaults (no models.toml)\n")
    assert "    prefix cache: " in ran.stdout and " in RAM, " in ran.stdout  # models.toml's budgets
    assert ran.stderr.startswith(
        "localserve: no configuration file found (--config, $LOCALSERVE_MODELS, ./models.toml): "
        "using the built-in defaults (the embedded gemma-3-270m)"
    )
    (tmp_path / "models.toml").write_text('default = "gemma-3-270m"\n')
    for argv in (["models"], ["models", "--config", "models.toml"]):
        ran = localserve(*argv, cwd=tmp_path)
        assert ran.stdout.startswith(f"configuration: {tmp_path / 'models.toml'}\n"), ran
        assert "no configuration file" not in ran.stderr


def test_a_reader_that_leaves_early_ends_usage_quietly(tmp_path):
    """`localserve usage --json | head -1`: no BrokenPipeError, the status of SIGPIPE."""
    from localserve.config import ServerConfig
    from localserve.ops.usage import Usage
    from tests.support.usage import recorded, row

    store = Usage(ServerConfig(state_dir=str(tmp_path)), "fake")
    recorded(store, *(row(f"user{i}") for i in range(5)))
    store.close()
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    with os.fdopen(write, "w") as closed:
        ran = localserve("usage", "--json", "--state-dir", str(tmp_path), stdout=closed)
    assert ran.returncode == 141
    assert ran.stderr == ""


def _commands():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_every_command_says_what_it_does_and_every_option_has_help_with_its_default():
    missing = []
    for name, command in _commands().items():
        if not command.description:
            missing.append(f"{name}: no description")
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = "/".join(action.option_strings) or action.dest
            if not action.help:
                missing.append(f"{name} {flag}: no help")
            elif action.default not in (None, False, [], "", argparse.SUPPRESS) and (
                "default" not in action.help
            ):
                missing.append(f"{name} {flag}: help without its default {action.default!r}")
    assert missing == []


@pytest.mark.parametrize(
    ("users", "trusted", "words"),
    [
        (None, '["openwebui"]', ["trusted_frontends: needs a server with tokens"]),
        ('openwebui = "owui-connection-key"', '["owui"]', ["'owui' is not a user"]),
    ],
)
def test_trusted_frontends_are_checked_before_anything_loads(tmp_path, users, trusted, words):
    (tmp_path / "models.toml").write_text(f"[server]\ntrusted_frontends = {trusted}\n")
    argv = ["serve", "--state-dir", str(tmp_path)]
    if users is not None:
        (tmp_path / "users.toml").write_text(f"[users]\n{users}\n")
        argv += ["--users", str(tmp_path / "users.toml")]
    line = slip_line(localserve(*argv, cwd=tmp_path), "[server] trusted_frontends", *words)
    assert line.startswith("localserve: [server] trusted_frontends: ")


def test_serve_refuses_a_users_file_others_may_read(tmp_path):
    """Every token in the open: refused in one line saying what to do, as the monitor token
    is; the owner's group may read it."""
    users = tmp_path / "users.toml"
    users.write_text('[users]\nkate = "correct-horse"\n')
    users.chmod(0o644)
    argv = ["serve", "--state-dir", str(tmp_path / "state"), "--users", str(users)]
    ran = localserve(*argv, cwd=tmp_path)
    slip_line(ran, f"{users}: others may read these tokens (mode 644)", f"chmod o-rwx {users}")


def test_a_frontends_people_may_have_quotas_in_the_users_file(tmp_path):
    (tmp_path / "models.toml").write_text('[server]\ntrusted_frontends = ["openwebui"]\n')
    (tmp_path / "users.toml").write_text(
        '[users]\nopenwebui = "owui-connection-key"\n'
        '[daily_tokens]\n"openwebui/alice" = 5000\n"nobody/x" = 5\n'
    )
    argv = ["serve", "--state-dir", str(tmp_path), "--users", str(tmp_path / "users.toml")]
    line = slip_line(localserve(*argv, cwd=tmp_path), "daily_tokens for users it does not have")
    assert "nobody/x" in line and "openwebui/alice" not in line


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_says_localserve_and_llama_cpp_python_without_loading_llama_cpp(flag):
    import importlib.metadata
    import tomllib

    from localserve import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]
    llama = importlib.metadata.version("llama-cpp-python")
    ran = localserve(flag)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"localserve {__version__} (llama-cpp-python {llama})\n"
    script = (
        f"import sys\nfrom localserve.cli import main\ntry:\n    main([{flag!r}])\n"
        "except SystemExit:\n    pass\nprint('llama_cpp' in sys.modules)"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.stdout.splitlines()[-1] == "False", out


FRONT_DOORS = ["chat page", "websocket chat", "OpenAI", "Ollama", "Anthropic"]


def test_serve_help_and_the_top_level_help_name_every_front_door():
    serve = " ".join(localserve("serve", "--help").stdout.split())  # argparse wraps lines
    for door in [*FRONT_DOORS, "/v1", "/api", "/v1/messages", "/healthz", "/metrics"]:
        assert door in serve, door
    top = " ".join(localserve("--help").stdout.split())
    for door in [*FRONT_DOORS, "/healthz", "/metrics"]:
        assert door in top, door


def test_serve_help_names_every_http_endpoint_the_server_has():
    """Each route of the app (but the page's files and a stored response's own paths) is named
    in `serve --help`: under its API's prefix, as "(a, b, ...)" lists them."""
    from localserve.serve import anthropic, ollama, openai, responses
    from tests.support.fake_frontdoor import FakeFrontdoor

    door = FakeFrontdoor()
    paths = [r.path for api in (openai, ollama, anthropic) for r in api.routes(door)]
    paths += [r.path for r in responses.routes(door, None) if "{" not in r.path]
    serve = " ".join(localserve("serve", "--help").stdout.split())
    for path in paths:
        path = path.partition("/{")[0]  # /v1/models/{model}: the list's own name says it
        prefix, _, name = path[1:].partition("/")
        listed = rf"/{prefix} \((?:[^)]*[ (,])?{re.escape(name)}[,)]"
        assert path in serve or re.search(listed, serve), path
