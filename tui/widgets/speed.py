"""How fast: TTFT, ITL and queue time percentiles, tokens per second, and what each step
carries (and, while there is embedding work, the tokens and inputs embedded per second).

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from localserve.protocol.snapshot import Percentiles, Snapshot
from tui.format import duration, rate


class LatencyPanel(Vertical):
    """TTFT, ITL and queue time percentiles, each with a sparkline of its p90."""

    NAMES = {"ttft": "TTFT", "itl": "ITL", "queue": "queue"}

    def compose(self) -> ComposeResult:
        for key, name in self.NAMES.items():
            with Horizontal(classes="metric-row"):
                yield Label(name, id=f"{key}-label", classes="metric-label")
                yield Sparkline([], id=f"{key}-spark", classes="metric-spark")
        yield Static("", id="waits")

    def show(self, snap: Snapshot, history: Sequence[Snapshot]) -> None:
        self.query_one("#waits", Static).update(waits_line(snap))
        for key, name in self.NAMES.items():
            p: Percentiles = getattr(snap, key)
            label = f"{name:<5} {duration(p.p50):>7}{duration(p.p90):>8}{duration(p.p99):>8}"
            self.query_one(f"#{key}-label", Label).update(label)
            values = [getattr(s, key).p90 or 0.0 for s in history]
            self.query_one(f"#{key}-spark", Sparkline).data = values or [0.0]


def waits_line(snap: Snapshot) -> str:
    """What a newcomer would wait now, and how far the predicted waits were off (the median, in
    seconds and as a share of the actual wait): localserve/engine/waits.py's predictions."""
    parts = []
    if snap.newcomer_wait_s is not None:
        parts.append(f"newcomer waits ~{duration(snap.newcomer_wait_s)}")
    error, share = snap.queue_error, snap.queue_error_share
    if error.count and error.p50 is not None and share.p50 is not None:
        parts.append(f"waits off {duration(error.p50)} ({share.p50:.0%}, {error.count} waited)")
    return " · ".join(parts)


class ThroughputPanel(Vertical):
    """Prompt and generated tokens/s with sparklines; what each step carries."""

    def compose(self) -> ComposeResult:
        for key in ("prompt", "gen"):
            with Horizontal(classes="metric-row"):
                yield Label("", id=f"{key}-label", classes="metric-label")
                yield Sparkline([], id=f"{key}-spark", classes="metric-spark")
        yield Static("", id="batch")

    def show(self, snap: Snapshot, history: Sequence[Snapshot]) -> None:
        rows = {
            "prompt": ("prompt", "prompt_tokens_per_s"),
            "gen": ("gen", "generation_tokens_per_s"),
        }
        for key, (name, field) in rows.items():
            value = getattr(snap, field)
            self.query_one(f"#{key}-label", Label).update(f"{name:<6} {rate(value):>6} tok/s")
            self.query_one(f"#{key}-spark", Sparkline).data = [
                getattr(s, field) for s in history
            ] or [0.0]
        self.query_one("#batch", Static).update(batch_text(snap))


def batch_text(snap: Snapshot) -> Text:
    """Per-step composition: decode vs prefill tokens, as numbers and a bar."""
    st = snap.steps
    if st.step_s is None:
        return Text("step no steps yet", style="grey50")
    decode, prefill = st.decode_tokens or 0.0, st.prefill_tokens or 0.0
    width = 10
    cap = max(snap.max_num_batched_tokens, 1)
    d = min(width, round(decode / cap * width))
    p = min(width - d, round(prefill / cap * width))
    text = Text("step ")  # decode tokens green, prefill yellow
    text.append("█" * d, style="green")
    text.append("█" * p, style="yellow")
    text.append("·" * (width - d - p), style="grey35")
    text.append(f" {decode:.0f}+{prefill:.0f} tok, {duration(st.step_s)}")
    if snap.embed_tokens_per_s or snap.embeddings:  # embedding work, its own kind
        text.append(
            f"\nembed {rate(snap.embed_tokens_per_s)} tok/s, "
            f"{snap.embed_inputs_per_s:.1f} inputs/s",
            style="cyan",
        )
    if st.draft_acceptance is not None:  # speculative decoding drafted in the recent steps
        per_decode = st.tokens_per_decode or 1.0
        text.append(
            f"\ndraft {st.draft_tokens or 0:.0f} rows/step, {st.draft_acceptance:.0%} kept: "
            f"{per_decode:.2f} tok per decode"
        )
    return text
