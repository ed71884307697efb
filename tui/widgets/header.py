"""The top of the screen: the header (the model, its state, its devices, the engine's and the
usage record's problems) and the diagnosis line under it.

Tested in tests/unit/tui/test_monitor.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from localserve.protocol.frames import ModelStatus
from localserve.protocol.snapshot import Device, Snapshot, Worker
from tui.format import clip, duration
from tui.widgets.style import SEPARATOR


class HeaderBar(Static):
    """Model, backend, slots, cells, policy and budget; connection state, or the engine's
    problem and the usage record's. A model split across devices (RPC workers) gets a second
    line listing them."""

    _state: tuple[Snapshot | None, bool, str, str, Sequence[ModelStatus], str | None] = (
        None, False, "", "", (), None
    )  # fmt: skip

    def show(
        self,
        snap: Snapshot | None,
        connected: bool,
        status: str,
        usage_problem: str = "",
        models: Sequence[ModelStatus] = (),
        watching: str | None = None,
    ) -> None:
        self._state = (snap, connected, status, usage_problem, models, watching)
        hinted = not connected and "\n" in status  # a refused token's hint: all of it shown
        self.set_class(hinted, "hinted")
        self.set_class(not hinted and snap is not None and has_device_line(snap), "two-lines")
        self.refresh()

    def render(self) -> Text:
        """Drawn at the widget's current width (also after a resize)."""
        *state, models, watching = self._state
        return header_text(*state, width=self.size.width, models=models, watching=watching)


PROBLEM_MIN = 30  # columns the engine's problem may take at least, the model's name or not


def header_text(
    snap: Snapshot | None,
    connected: bool,
    status: str,
    usage_problem: str,
    width: int,
    models: Sequence[ModelStatus] = (),
    watching: str | None = None,
) -> Text:
    """The connection state (or, while connected, the engine's and the usage record's
    problems), then as many facts about the server as fit in `width` columns (a fact that does
    not fit is left out, never wrapped), each behind its own separator; then, for a split
    model, a line of its devices; a status's second line (a refused token's hint) instead. With
    several models, which one the panels show comes first (and the one asked for, `watching`,
    while it has no figures of its own: never loaded yet)."""
    text = Text(no_wrap=True, overflow="crop")
    status, _, hint = status.partition("\n")
    hint = "" if connected else hint
    problems = []
    if connected and snap is not None and snap.engine_problem.strip():
        problems.append(f"engine down: {snap.engine_problem.strip()}")
    if connected and snap is not None and usage_problem.strip():
        problems.append(f"usage not recorded: {usage_problem.strip()}")
    if problems:
        room = max(width - len(snap.model.model) - 4, PROBLEM_MIN)  # and " · " + the model's name
        text.append(clip("● " + "; ".join(problems), room), style="bold red")
        text.append(" ·", style="grey50")
    elif connected:
        text.append("● live", style="bold green")
    else:
        text.append(f"● {status}", style="bold red")
    if snap is None:
        return _with_hint(text, hint)
    m = snap.model
    where = m.backend if m.backend == "CPU" else f"{m.backend} {m.n_gpu_layers}/{m.n_layer}L"
    facts = [
        (m.model, "bold"),
        (where, ""),
        (f"{snap.max_num_seqs} slots", ""),
        (f"{snap.kv_total} cells", ""),
        (f"{snap.policy} ≤{snap.max_num_batched_tokens} tok/step", ""),
        (f"ITL ≤{duration(snap.itl_target_s)}", ""),
    ]
    if m.devices:
        del facts[1]  # the devices' line says where
    if len(models) > 1:  # several models: which one the panels show, then each one's state
        shown = f"panels: {m.model}"
        if watching and watching != m.model:
            shown += f" ({watching} not loaded)"
        facts[0] = (shown, "bold")
        facts.insert(1, ("models: " + ", ".join(model_word(x) for x in models), ""))
    text.append(" ")
    _append_facts(text, facts, width)
    if hint:
        return _with_hint(text, hint)
    if has_device_line(snap):
        text.append("\n")
        text.append_text(devices_text(m.devices, snap.workers, width))
    return text


def _append_facts(text: Text, facts: list[tuple[str, str]], width: int) -> None:
    """As many facts as fit in `width`, in order, each behind its separator (a fact that does
    not fit is left out; the models' states are cut to fit instead, while they can be)."""
    for i, (fact, style) in enumerate(facts):
        sep = SEPARATOR if i else ""
        room = width - text.cell_len - len(sep)
        if fact.startswith("models: ") and len(fact) > room >= MODELS_MIN:
            fact = clip(fact, room)  # the models' states matter more than the settings after
        if i and len(fact) > room:
            continue
        text.append(sep, style="grey50")
        text.append(fact, style=style)


def _with_hint(text: Text, hint: str) -> Text:
    """The header and, below it, the hint (the widget wraps it: `#header.hinted`)."""
    if hint:
        text.append(f"\n{DEVICE_INDENT}{hint}")
    return text


def model_word(m: ModelStatus) -> str:
    """A model's state in a few words: "small loading (2 waiting)", "coder idle"."""
    state = m.state
    if state == "loaded":
        state = "busy" if m.busy else "idle"
    elif state == "loading" and m.waiting:
        state = f"loading ({m.waiting} waiting)"
    return f"{m.name} {state}"


def has_device_line(snap: Snapshot) -> bool:
    """A split model, or an RPC worker down: the header's second line."""
    return bool(snap.model.devices) or any(not w.up for w in snap.workers)


DEVICE_INDENT = "  "  # under the state's "●"
MODELS_MIN = 24  # the models' fact is cut to fit, down to this many columns


def devices_text(devices: Sequence[Device], workers: Sequence[Worker], width: int) -> Text:
    """Each device with its layers ("RPC1 10.0.0.2:50052 6L"), its KV cache where the line has
    room for it, and "down" in red on a worker found down; workers down that hold no device's
    layers follow. What does not fit is counted at the end ("+2 more")."""
    down = {w.endpoint for w in workers if not w.up}
    listed = {d.endpoint for d in devices}
    forms = (  # the most said that fits
        lambda d: f"{d.label} {d.layers}L, KV {d.kv_mib:,.0f} MiB",
        lambda d: f"{d.label} {d.layers}L",
        lambda d: f"{d.name} {d.layers}L",
    )
    extra = [
        (f"worker {w.endpoint}", True) for w in workers if not w.up and w.endpoint not in listed
    ]
    for form in forms:
        parts = [(form(d), bool(d.endpoint) and d.endpoint in down) for d in devices] + extra
        line = _device_parts(parts, width, whole=True)
        if line is not None:
            return line
    return _device_parts(parts, width, whole=False)


def _device_parts(parts: list[tuple[str, bool]], width: int, whole: bool) -> Text | None:
    """The parts in `width` columns after the indent, a down one in red with "down" after it.
    `whole`: all of them, or None when they do not fit; else those that fit and "+N more"."""
    text = Text(DEVICE_INDENT, no_wrap=True, overflow="crop")
    for i, (part, is_down) in enumerate(parts):
        sep = SEPARATOR if i else ""
        tail = " down" if is_down else ""
        left = len(parts) - i - 1  # after this one
        more = f"{SEPARATOR}+{left} more" if left and not whole else ""
        if i and text.cell_len + len(sep) + len(part) + len(tail) + len(more) > width:
            if whole:
                return None
            text.append(f"{SEPARATOR}+{left + 1} more", style="grey50")
            break
        text.append(sep, style="grey50")
        text.append(part, style="red" if is_down else "")
        if tail:
            text.append(tail, style="bold red")
    if whole and text.cell_len > width:
        return None
    return text


class DiagnosisLine(Static):
    """What limits the server right now, in plain words."""

    def show(self, level: str, headline: str) -> None:
        self.set_classes(f"level-{level}")
        self.update(Text(f" {headline}"))
