"""Reading the Textual monitor's screen (tui/app.py) in tests."""

from __future__ import annotations

from tui.app import MonitorApp
from tui.widgets import HeaderBar


def header_text(app: MonitorApp) -> str:
    return str(app.query_one(HeaderBar).render())
