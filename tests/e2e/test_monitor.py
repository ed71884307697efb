"""The Textual monitor (tui/monitor.py) watching a real server with the real model: a running
sequence shows up."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.monitor import header_text
from tests.support.waiting import async_wait_until
from tui.monitor import MonitorApp
from tui.source import WebSocketSource
from tui.widgets.requests import RunningTable


@pytest.mark.model
def test_monitor_sees_a_running_sequence_on_a_real_server(live):
    from localserve.bench.blocking_ws import WS

    async def run():
        app = MonitorApp(WebSocketSource(live.url, interval_ms=100), live.url)
        async with app.run_test(size=(100, 30)) as pilot:
            ws = WS(live.url)
            ws.hello("watcher")
            ws.chat("seen", "Tell me a story.", max_tokens=400, ignore_eos=True)
            table = app.query_one(RunningTable)
            await async_wait_until(
                lambda: table.row_count, 30, "a row", pause=lambda: pilot.pause(0.02)
            )
            assert table.row_count == 1
            assert "watcher" in str(table.get_row_at(0)[0])
            assert "● live" in header_text(app)
            ws.send({"type": "cancel", "id": "seen"})
            ws.until_done("seen")
            ws.close()

    asyncio.run(run())
    live.wait_idle()


@pytest.mark.model
def test_the_demo_log_file_gets_the_servers_log_and_the_engine_processs(tmp_path):
    """`localserve demo` owns the terminal: its log file has what the server and the engine
    process log, not only warnings."""
    import os
    import subprocess
    import sys

    from localserve.runners.models import cache_dir
    from tests.support.paths import ROOT

    log = cache_dir() / "demo.log"
    before = log.stat().st_size if log.exists() else 0  # the file is appended to
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shot = tmp_path / "demo.svg"
    argv = [sys.executable, "-m", "localserve", "demo", "--screenshot", str(shot), "--after", "3"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=True)
    assert f"(log: {log})" in out.stdout
    text = log.read_bytes()[before:].decode(errors="replace")  # this run's lines
    assert "INFO localserve: localserve: " in text  # what runs where, as printed
    assert "INFO localserve.serve.server: listening on 127.0.0.1:" in text
    assert "INFO localserve.engine_process.parent: engine process" in text
    assert shot.exists()
