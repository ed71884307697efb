"""The requests: a table of the running sequences and one of those waiting; embedding requests
are rows of their own kind in both (phase `embed 12/64`: inputs embedded of all, and `(embed)`
after a waiting one's id), after the chats. A sequence whose prefix was restored from a tier of
the prefix cache says so apart from a prefill: phase `restored 1.4k · 97%` while it finishes its
prompt, and its cached column gives the tokens restored and their tier (`1420 host`).

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from localserve.protocol.snapshot import Snapshot
from tui.format import (
    NARROW_USER_WIDTH,
    USER_WIDTH,
    WIDE_USER_WIDTH,
    duration,
    pct,
    rate,
    tokens,
    user_label,
)
from tui.widgets.style import user_color


class RunningTable(DataTable):
    """One row per running sequence."""

    # the timings right after the phase: at 80 columns the table shows user to tok/s, ITL
    # included; the counts and cached (prompt tokens reused from a cached prefix: the legend
    # above counts the reuse) come after them
    COLUMNS = (
        "user",
        "request",
        "phase",
        "TTFT",
        "ITL",
        "tok/s",
        "prompt",
        "gen",
        "idle",
        "cached",
    )
    OTHERS_WIDTH = 60  # what the columns after the user's take, up to ITL at least

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.cursor_type = "none"

    def show(self, snap: Snapshot) -> None:
        self.clear()
        width = user_width(self)
        for r in snap.seqs:
            done = pct(r.computed_tokens / max(r.prompt_tokens, 1))
            if r.phase == "prefill" and r.restored_tokens:
                phase = (
                    f"restored {tokens(r.restored_tokens)} · {done}"  # copied back, not computed
                )
            elif r.phase == "prefill":
                phase = "prefill " + done
            else:
                phase = "decode" + (f" ({r.num_preemptions}×↺)" if r.num_preemptions else "")
            cached = str(r.cached_tokens)
            if r.restored_from:
                cached = f"{r.restored_tokens} {r.restored_from}"
            self.add_row(
                Text(user_label(r.user, width), style=user_color(r.user)),
                r.client_id,
                phase,
                duration(r.ttft_s),
                duration(r.last_itl_s),
                rate(r.tokens_per_s),
                str(r.prompt_tokens),
                str(r.output_tokens),
                duration(r.since_last_token_s),
                cached,
            )
        for e in snap.embeddings:
            if e.phase != "running":
                continue
            self.add_row(
                Text(user_label(e.user, width), style=user_color(e.user)),
                e.client_id,
                f"embed {e.inputs_done}/{e.inputs}",
                "—",
                "—",
                "—",
                str(e.tokens),
                "—",
                "—",
                "—",
            )


def user_width(table: DataTable) -> int:
    """How much of a user's name a table shows: less on a narrow one (80 columns), and on a
    wide one what its other columns leave (OTHERS_WIDTH), up to WIDE_USER_WIDTH."""
    width = table.size.width
    least = USER_WIDTH if width > 60 else NARROW_USER_WIDTH
    return max(least, min(WIDE_USER_WIDTH, width - table.OTHERS_WIDTH))


class WaitingTable(DataTable):
    """The queue, in admission order (the first row is admitted next)."""

    # the numbers first, the request id last: on a narrow screen only the id is cut short
    COLUMNS = ("user", "waited", "enters", "prompt", "request")
    OTHERS_WIDTH = 26  # waited, enters (the predicted wait) and prompt (the id is cut first)

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.cursor_type = "none"

    def show(self, snap: Snapshot) -> None:
        self.clear()
        width = user_width(self)
        for w in snap.waiting_seqs:
            request = w.client_id + (" (preempted)" if w.is_preempted else "")
            self.add_row(
                Text(user_label(w.user, width), style=user_color(w.user)),
                duration(w.waited_s),
                "—" if w.predicted_wait_s is None else f"~{duration(w.predicted_wait_s)}",
                str(w.prompt_tokens),
                request,
            )
        for e in snap.embeddings:
            if e.phase == "waiting":
                self.add_row(
                    Text(user_label(e.user, width), style=user_color(e.user)),
                    duration(e.waited_s),
                    "—",
                    str(e.tokens),
                    f"{e.client_id} (embed, {e.inputs} inputs)",
                )
