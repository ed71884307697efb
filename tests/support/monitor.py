"""Reading the Textual monitor's screen (tui/monitor.py) in tests."""

from __future__ import annotations

from tui.monitor import MonitorApp
from tui.widgets import HeaderBar


def header_text(app: MonitorApp) -> str:
    return str(app.query_one(HeaderBar).render())
