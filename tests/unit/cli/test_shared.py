"""What the commands share (localserve/cli/shared.py): the --no-prefix-cache option, the
unknown model said before anything loads, the server addresses chat and monitor accept."""

from __future__ import annotations


def test_no_prefix_cache_turns_prefix_caching_off():
    from localserve.cli import build_parser
    from localserve.cli.shared import prefix_cache_option
    from localserve.config import Config

    config = Config()
    assert config.scheduler.prefix_caching
    off = prefix_cache_option(config, True)
    assert off.scheduler.prefix_caching is False and config.scheduler.prefix_caching
    assert prefix_cache_option(config, False) is config
    assert build_parser().parse_args(["serve", "--no-prefix-cache"]).no_prefix_cache
    assert not build_parser().parse_args(["serve"]).no_prefix_cache


def test_an_unknown_model_names_the_option_and_the_known_ones():
    import pytest

    from localserve.cli.shared import model_name
    from localserve.config import ConfigError, builtin_config

    config = builtin_config()
    assert model_name(config, None) == model_name(config, "gemma-3-270m") == "gemma-3-270m"
    with pytest.raises(ConfigError, match=r"--model: unknown model 'x' \(models.toml has: gemma"):
        model_name(config, "x")


def test_the_address_serve_prints_and_host_port_become_websocket_urls():
    import pytest

    from localserve.websocket_client import websocket_url

    assert websocket_url("http://127.0.0.1:8765") == "ws://127.0.0.1:8765"
    assert websocket_url("https://chat.example.org/") == "wss://chat.example.org/"
    assert websocket_url("localhost:8765") == "ws://localhost:8765"
    assert websocket_url(" ws://[::1]:8765 ") == "ws://[::1]:8765"
    assert websocket_url("WSS://h:1") == "wss://h:1"
    with pytest.raises(ValueError, match="not a server address"):
        websocket_url("ftp://h:1")


def test_the_log_file_of_a_full_screen_command_gets_the_servers_info_lines(tmp_path):
    """log_to_file (demo, monitor): the server's INFO lines reach the file (a terminal shows
    only warnings), and the root's level, which the engine process is started with, is INFO."""
    import os
    import subprocess
    import sys

    from tests.support.paths import ROOT

    code = (
        "import logging; "
        "logging.basicConfig(level=logging.WARNING); "
        "from localserve.cli.shared import log_to_file; path = log_to_file('demo'); "
        "logging.getLogger('localserve.serve.server').info('listening on 127.0.0.1:1'); "
        "logging.getLogger('localserve.engine_process.parent').warning('engine restarted'); "
        "logging.getLogger('localserve').debug('not this'); "
        "print(path, logging.getLogger().level)"
    )
    env = {**os.environ, "LOCALSERVE_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    path, level = out.stdout.split()
    assert path == str(tmp_path / "demo.log") and int(level) == 20  # INFO: the child's too
    text = (tmp_path / "demo.log").read_text()
    assert "INFO localserve.serve.server: listening on 127.0.0.1:1" in text
    assert "WARNING localserve.engine_process.parent: engine restarted" in text
    assert "not this" not in text and out.stderr == ""
