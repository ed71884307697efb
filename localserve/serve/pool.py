"""The models a server serves: one slot per model in models.toml, loaded when asked for.

`ModelPool` is owned by the server's event loop. Each slot is one model with its own engine
(a supervised engine process, or the in-process engine of `engine_process = false`), its
prompt builder, its call and reasoning formats and its snapshots. A slot is `unloaded`,
`loading`, `loaded` (idle since a time, or busy) or `failed` (with the reason). The default
model is loaded at start; any other loads on the first request that names it, on a thread of
the loop's executor (loading takes seconds). Requests that come while their model loads wait
for it (admission shows them as `loading`); a load that fails fails the requests waiting for
it, and the next request tries again, at most once per RETRY_LOAD_S.

Memory: before a model loads, its need (runners/footprint.py, from its GGUF header) is set
against the budget (`[server] memory_budget_mib`, or what footprint says is available less its
reserve) and the loaded ones; `max_loaded_models` caps their count. A model that does not fit
evicts the least recently used idle one (no request in flight or waiting); a busy one is never
evicted: the newcomer waits ("waiting for memory: X is busy") until one goes idle. A model
bigger than the whole budget fails its requests. After `keep_alive` seconds idle a model is
unloaded: its engine process exits and its memory is returned. A person's loads that evict
models others use are budgeted (swaps.py): past it, their load waits, told why.

Each load, failed load, swap (an eviction for another model) and unload is one INFO (a failure:
WARNING) line of this module's logger with how long it took, e.g. "model qwen loaded in 6.4 s
(1,234 MiB)"; `localserve serve` shows them on its console (cli/__init__.py).

Tested in tests/unit/serve/test_pool.py and tests/e2e/test_several_models.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localserve.chat.formats import ModelFormats, model_formats
from localserve.config import Config, ModelConfig, ServerConfig, is_template_file, parse_keep_alive
from localserve.engine.client import EngineClient
from localserve.engine.events import EventSink
from localserve.engine.runner import Runner
from localserve.serve.door import ModelDescription
from localserve.serve.prompt import PromptBuilder, check_template
from localserve.serve.snapshots import Snapshots
from localserve.serve.swaps import SwapBudget

log = logging.getLogger("localserve.serve.pool")

RETRY_LOAD_S = 5.0  # a model that failed to load is tried again at most this often
MIB = 1 << 20


class UnknownModel(ValueError):
    """A model name this server does not have; the message names the configured ones."""


class LoadFailure(Exception):
    """A model could not be loaded (or cannot fit): `message` says which and why."""

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.message, self.retry_after_s = message, retry_after_s


class Abandoned(LoadFailure):
    """A load given up before it started, while it waited for room: nobody waits for it (not
    an error: one INFO line, and its future ends without an exception nobody would read)."""


@dataclass
class LoadedModel:
    """What a loader gives: the engine, the runner's text side, and how to put both away."""

    engine: EngineClient
    runner: Runner
    close: Callable[[], None]


# a loader: the model's name -> LoadedModel (blocking; raises when it cannot load)
Loader = Callable[[str], LoadedModel]


@dataclass(eq=False)
class ModelSlot:
    """One configured model and, while it is loaded, its engine and prompt builder."""

    name: str
    model: ModelConfig
    keep_alive_s: float  # idle seconds before it is unloaded; < 0 = never
    state: str = "unloaded"  # unloaded | loading | loaded | failed
    reason: str = ""  # why it failed, or what its loading waits for
    since: float = field(default_factory=time.time)  # the state's (or idleness') start
    loaded: LoadedModel | None = None
    prompts: PromptBuilder | None = None
    # its engine's snapshots, kept across loads (the last figures stay while it is unloaded)
    snapshots: Snapshots = field(init=False)
    need_bytes: int = 0  # its memory need (footprint.py), 0 = unknown
    active: int = 0  # requests in flight or waiting for it
    last_used: float = 0.0  # time.monotonic() of its last request's end
    expires: float | None = None  # time.time() at which it unloads (idle, keep_alive >= 0)
    retry_at: float = 0.0  # after a failure: monotonic time the next load may start
    load_ms: float = 0.0  # how long its last load took
    _formats: ModelFormats | None = None
    _ready: asyncio.Future | None = None  # while loading
    _has_room: bool = False  # loading, its room made: counted as loaded by other loads
    _told: list[Callable[[str], None]] = field(default_factory=list)  # waiters, told why
    _asking: list[str] = field(default_factory=list)  # the people waiting, first come first
    # a load waits for this busy model to drain: new requests for it wait for their turn
    # (until that load ends) instead of keeping it busy for ever
    yielding_to: str = ""
    _turn: asyncio.Event | None = None  # set when the load it yields to has ended
    _timer: asyncio.TimerHandle | None = None  # its keep_alive unload

    def __post_init__(self) -> None:
        self.snapshots = Snapshots(lambda: self.engine)  # while unloaded: NoModelLoaded

    @property
    def engine(self) -> EngineClient | None:
        return self.loaded.engine if self.loaded is not None else None

    @property
    def is_loaded(self) -> bool:
        return self.state == "loaded"

    @property
    def n_ctx(self) -> int:
        """Its context length: the loaded runner's, else models.toml's."""
        return self.prompts.n_ctx if self.prompts is not None else self.model.n_ctx

    @property
    def formats(self) -> ModelFormats:
        """Its call and reasoning formats: the loaded runner's template, else its GGUF's."""
        if self._formats is None:
            m = self.model
            source = None if m.chat_format == "transcript" else _template_source(self.name, m)
            self._formats = model_formats(m.chat_format, source, m.tool_format, m.reasoning_format)
        return self._formats

    def describe(self, waiting: int = 0) -> ModelDescription:
        """Its state as /healthz and the list endpoints show it, with `waiting` requests
        waiting for its load."""
        busy = self.is_loaded and self.active > 0
        body = ModelDescription(
            name=self.name,
            state=self.state,
            busy=busy,
            since=self.since,
            memory_mib=round(self.need_bytes / MIB, 1) if self.need_bytes else None,
            keep_alive_s=self.keep_alive_s,
            n_ctx=self.n_ctx,
            waiting=waiting,
        )
        if self.reason:
            body["reason"] = self.reason
        if self.expires is not None and not busy:
            body["expires_at"] = self.expires
        if self.yielding_to:
            body["yielding_to"] = self.yielding_to
        return body


class ModelPool:
    """The server's models, by name; loads, evicts and unloads them (on the loop)."""

    def __init__(
        self,
        config: Config,
        server_config: Callable[[], ServerConfig],
        loader: Loader | None,
        on_events: EventSink,
        default: str | None = None,
        models_file: Path | None = None,
    ) -> None:
        self.default = default or config.default
        self._config = config  # the loader's: a model added here is loaded from it
        self.models_file = models_file  # the models.toml it came from (None: built in)
        self.pull_lock = asyncio.Lock()  # one pull at a time (serve/pulling.py)
        self._server_config = server_config
        self._loader = loader
        self._on_events = on_events
        self.slots = {
            name: ModelSlot(name, m, parse_keep_alive(m.keep_alive, f"models.{name}.keep_alive"))
            for name, m in config.models.items()
        }
        self._budget: int | None = None  # bytes, measured at the first load that needs it
        # each person's swaps that evicted a model others use (serve/swaps.py)
        self.swaps = SwapBudget(lambda: server_config().max_swaps_per_person, time.monotonic)
        self._memory_changed = asyncio.Event()  # a model went idle or unloaded
        self._closing = False

    def add(self, name: str, model: ModelConfig) -> ModelSlot:
        """A model added while serving (a pull): listed at once, loaded when first asked for."""
        if name in self.slots:
            raise ValueError(f"model {name!r} is already served")
        self._config.models[name] = model
        where = f"models.{name}.keep_alive"
        self.slots[name] = ModelSlot(name, model, parse_keep_alive(model.keep_alive, where))
        return self.slots[name]

    # --- looking up -----------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self.slots)

    def slot(self, name: str | None) -> ModelSlot:
        """The slot of `name` (None: the default); UnknownModel naming the configured ones."""
        slot = self.slots.get(self.default if name is None else name)
        if slot is None:
            known = ", ".join(repr(n) for n in self.slots)
            raise UnknownModel(f"model {str(name)[:100]!r} not found; this server has {known}")
        return slot

    def primary(self) -> ModelSlot | None:
        """The slot whose engine figures /healthz, /metrics and the monitor show: the default
        when it is loaded, else the loaded one used last."""
        default = self.slots[self.default]
        if default.is_loaded:
            return default
        loaded = [s for s in self.slots.values() if s.is_loaded]
        return max(loaded, key=lambda s: s.last_used) if loaded else None

    def start(self) -> None:
        """On the loop, once it runs: the keep_alive of the models loaded before it."""
        for slot in self.slots.values():
            if slot.is_loaded and slot._timer is None:
                self._arm(slot)

    # --- loading --------------------------------------------------------------------------------

    def add_loaded(self, name: str, loaded: LoadedModel, load_ms: float = 0.0) -> ModelSlot:
        """Install a model loaded outside the pool (the default, by serving())."""
        slot = self.slot(name)
        self._install(slot, loaded)
        slot.load_ms = load_ms
        return slot

    def _install(self, slot: ModelSlot, loaded: LoadedModel) -> None:
        runner, model = loaded.runner, slot.model
        check_template(slot.name, model.chat_format, runner.apply_chat_template)
        slot._formats = model_formats(
            model.chat_format, runner.template_source, model.tool_format, model.reasoning_format
        )
        slot.prompts = PromptBuilder(
            runner.tokenize,
            runner.apply_chat_template,
            runner.info.n_ctx,
            model.chat_format,
            model.system_prompt,
            describe_tools=slot._formats.tool == "generic",
        )
        loaded.engine.on_events = self._on_events
        slot.loaded, slot.state, slot.reason, slot.since = loaded, "loaded", "", time.time()
        slot.last_used = time.monotonic()
        slot.keep_alive_s = parse_keep_alive(model.keep_alive)  # a request's lasted until now
        if not slot.need_bytes:
            slot.need_bytes = _need(slot)
        self._arm(slot)

    async def ready(
        self, slot: ModelSlot, waiting: Callable[[str], None], held: bool = False, person: str = ""
    ) -> None:
        """Until `slot` is loaded (loading it when no one is); LoadFailure when it cannot.
        `waiting(reason)` is told what the load waits for while it does. `held`: the caller
        holds the slot (`acquire`) for a newcomer request; when the slot yields to another
        model's load, its turn comes after that load, and it waits not holding the slot. A
        request that waited for this slot's own load goes ahead once it is loaded, even if
        the slot yields by then: it was there first. `person`: whose request it is (the swap
        budget of the first one waiting is what its load's evictions count against)."""
        if held and slot.is_loaded and slot.yielding_to:
            await self._wait_for_turn(slot, waiting, held)
        while not slot.is_loaded:
            if self._closing:
                raise LoadFailure("the server is shutting down")
            if slot.yielding_to:  # evicted for a load still going on: not before it
                await self._wait_for_turn(slot, waiting, held)
                continue
            if slot._ready is None:
                now = time.monotonic()
                if slot.state == "failed" and now < slot.retry_at:
                    wait = slot.retry_at - now
                    raise LoadFailure(f"model {slot.name} could not be loaded: {slot.reason}", wait)
                slot._ready = asyncio.ensure_future(self._load(slot))
            slot._told.append(waiting)
            slot._asking.append(person)
            try:
                await asyncio.shield(slot._ready)
            finally:
                slot._told.remove(waiting)
                slot._asking.remove(person)
                if not slot._told:  # a load still making room stops: nobody waits for it
                    self._memory_changed.set()

    async def _wait_for_turn(
        self, slot: ModelSlot, waiting: Callable[[str], None], held: bool
    ) -> None:
        """A request of a model that yields: wait, not holding it (`held`: the caller's hold
        is given back meanwhile), until the load it yields to has ended. It is then unloaded
        (it was evicted for that load), or still loaded if that load failed."""
        turn = slot._turn
        waiting(f"waiting for its turn: model {slot.yielding_to} loads first")
        slot.active -= held
        if slot.active == 0:
            self._memory_changed.set()
        try:
            await turn.wait()
        finally:
            slot.active += held

    def _yield(self, busy: list[ModelSlot], slot: ModelSlot) -> None:
        """The busy models in `slot`'s way take no new request until its load has ended."""
        for other in busy:
            if other.is_loaded and not other.yielding_to:
                log.info("model %s takes no new request until %s is loaded", other.name,
                         slot.name)  # fmt: skip
                other.yielding_to, other._turn = slot.name, asyncio.Event()

    def _end_turns(self, slot: ModelSlot) -> None:
        """`slot`'s load ended: the models that yielded to it take requests again."""
        for other in self.slots.values():
            if other.yielding_to == slot.name:
                turn, other.yielding_to, other._turn = other._turn, "", None
                if turn is not None:
                    turn.set()

    async def _load(self, slot: ModelSlot) -> None:
        slot.state, slot.reason, slot.since = "loading", "", time.time()
        started = time.monotonic()
        try:
            await self._make_room(slot)
            slot._has_room, slot.reason = True, ""
            log.info("loading model %s", slot.name)
            loaded = await asyncio.get_running_loop().run_in_executor(None, self._loader, slot.name)
            if self._closing:
                await asyncio.get_running_loop().run_in_executor(None, loaded.close)
                raise LoadFailure("the server is shutting down")
            self._install(slot, loaded)
            slot.load_ms = (time.monotonic() - started) * 1e3
            size = f" ({slot.need_bytes / MIB:,.0f} MiB)" if slot.need_bytes else ""
            log.info("model %s loaded in %.1f s%s", slot.name, slot.load_ms / 1e3, size)
        except Abandoned:  # not a failure: the next request loads it as if it never started
            slot.state, slot.reason, slot.since = "unloaded", "", time.time()
            took = time.monotonic() - started
            log.info("model %s: load given up after %.1f s, nobody waits for it", slot.name, took)
            return  # a waiter that came meanwhile finds it unloaded and loads it (ready's loop)
        except Exception as e:
            message = e.message if isinstance(e, LoadFailure) else str(e) or type(e).__name__
            prefix = f"model {slot.name} could not be loaded: "
            why = message.removeprefix(prefix)
            slot.state, slot.reason, slot.since = "failed", why, time.time()
            slot.retry_at = time.monotonic() + RETRY_LOAD_S
            took = time.monotonic() - started
            log.warning("model %s could not be loaded after %.1f s: %s", slot.name, took, why)
            raise LoadFailure(prefix + why, RETRY_LOAD_S) from None
        finally:
            slot._ready, slot._has_room = None, False
            self._end_turns(slot)
            self._memory_changed.set()  # a load that ended frees (or takes) its room

    # --- memory ---------------------------------------------------------------------------------

    def budget(self) -> int:
        """The bytes models may use together: memory_budget_mib, else what footprint.py says is
        available now less its reserve, plus what the loaded models already hold."""
        mib = self._server_config().memory_budget_mib
        if mib:
            return mib * MIB
        if self._budget is None:
            from localserve.runners import footprint

            gpu = footprint.device_available()
            available = gpu if gpu is not None else footprint.host_available()
            held = sum(s.need_bytes for s in self.slots.values() if s.is_loaded)
            self._budget = available.usable + held
        return self._budget

    async def _make_room(self, slot: ModelSlot) -> None:
        """Evict idle models (least recently used first) until `slot` fits; wait while the
        ones in the way are busy; LoadFailure when it can never fit."""
        if not slot.need_bytes:
            slot.need_bytes = await asyncio.get_running_loop().run_in_executor(None, _need, slot)
        cap = self._server_config().max_loaded_models
        need, budget = slot.need_bytes, self.budget()
        if need > budget:
            raise LoadFailure(
                f"model {slot.name} could not be loaded: it needs {need / MIB:.0f} MiB, more "
                f"than the whole memory budget ({budget / MIB:.0f} MiB)"
            )
        while True:
            loaded = self._holding(slot)
            idle, blocked = room_for(need, loaded, budget, cap)
            if not idle and not blocked:
                return
            if not slot._told:  # everyone who wanted it left: no eviction, no swap for nobody
                raise Abandoned(f"nobody waits for model {slot.name} any more")
            person = slot._asking[0] if slot._asking else ""
            # what it would evict first: an idle model, else a busy one it would wait for
            first = idle[0] if idle else next((s for s in loaded if s.is_loaded), None)
            if first is not None and (wait := self.swaps.wait_s(person, first.name)) > 0:
                self._end_turns(slot)  # nobody stops taking requests for a load that waits
                await self._wait_swap(slot, first, wait)
                continue
            if idle:
                self.swaps.evicted(person, idle[0].name)
                used = sum(s.need_bytes for s in loaded)
                if used + need > budget:
                    why = f"memory: {need / MIB:,.0f} MiB needed, {used / MIB:,.0f} of "
                    why += f"{budget / MIB:,.0f} MiB in use"
                else:
                    why = f"max_loaded_models = {cap}"
                log.info("swap: unloading %s to load %s (%s)", idle[0].name, slot.name, why)
                await self.unload(idle[0], f"for {slot.name}")
                continue
            self._yield(loaded, slot)
            busy = ", ".join(s.name for s in loaded)
            slot.reason = f"waiting for memory: {busy} {'is' if len(loaded) == 1 else 'are'} busy"
            for tell in list(slot._told):  # every request waiting for this load
                tell(slot.reason)
            self._memory_changed.clear()
            await self._memory_changed.wait()
            if self._closing:
                raise LoadFailure("the server is shutting down")

    async def _wait_swap(self, slot: ModelSlot, other: ModelSlot, wait_s: float) -> None:
        """`slot`'s load waits (at most `wait_s`, or until memory changes) before it may evict
        `other`: its person's swaps of models others use are spent for now (swaps.py)."""
        slot.reason = (
            f"waiting: model {other.name} is serving others for {math.ceil(wait_s)} s more"
        )
        for tell in list(slot._told):
            tell(slot.reason)
        self._memory_changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._memory_changed.wait()
        if self._closing:
            raise LoadFailure("the server is shutting down")

    def _holding(self, slot: ModelSlot) -> list[ModelSlot]:
        """The models holding memory `slot` would need: the loaded ones, and the loading ones
        that made their room (counted as loaded and busy)."""
        return [s for s in self.slots.values() if (s.is_loaded or s._has_room) and s is not slot]

    async def choice(self, slot: ModelSlot) -> Choice:
        """What choosing `slot` now would cost: the models its load would unload, and about
        how long it takes (its last load's time, else an estimate at the rate of earlier loads)."""
        if slot.state not in ("loaded", "loading"):
            if not slot.need_bytes:
                loop = asyncio.get_running_loop()
                slot.need_bytes = await loop.run_in_executor(None, _need, slot)
            budget, cap = self.budget(), self._server_config().max_loaded_models
            loaded = self._holding(slot)
            idle, blocked = room_for(slot.need_bytes, loaded, budget, cap)
            busy = [s for s in loaded if s not in idle] if blocked else []
            too_big = slot.need_bytes > budget
            swap = [s.name for s in idle + busy] if not too_big else []
            choice = Choice(swap, bool(busy), too_big)
        else:
            choice = Choice()
        if slot.state != "loaded":
            choice.load_s, choice.load_s_from = self._load_time(slot)
        return choice

    def _load_time(self, slot: ModelSlot) -> tuple[float | None, str]:
        """(seconds, "last_load" | "estimate") a load of `slot` takes; (None, "") unknown."""
        if slot.load_ms:
            return round(slot.load_ms / 1e3, 1), "last_load"
        loads = [s for s in self.slots.values() if s.load_ms and s.need_bytes]
        if not loads or not slot.need_bytes:
            return None, ""
        ms_per_byte = sum(s.load_ms for s in loads) / sum(s.need_bytes for s in loads)
        return round(slot.need_bytes * ms_per_byte / 1e3, 1), "estimate"

    # --- requests and idleness ------------------------------------------------------------------

    def acquire(self, slot: ModelSlot, person: str = "") -> None:
        """A request (of `person`) for `slot` is in flight or waiting: it is not idle."""
        if person:
            self.swaps.served(slot.name, person)
        slot.active += 1
        slot.expires = None
        if slot._timer is not None:
            slot._timer.cancel()
            slot._timer = None

    def release(self, slot: ModelSlot, keep_alive_s: float | None = None) -> None:
        """A request for `slot` ended: its idle time runs from now, the request's own
        `keep_alive_s` (as Ollama's) or else the model's, unless models.toml pins the model
        (keep_alive = -1: no client unloads it for everyone)."""
        slot.active = max(0, slot.active - 1)
        configured = parse_keep_alive(slot.model.keep_alive)
        pinned = configured < 0
        slot.keep_alive_s = configured if keep_alive_s is None or pinned else keep_alive_s
        if slot.active == 0 and slot.is_loaded:
            slot.last_used = time.monotonic()
            slot.since = time.time()
            self._arm(slot)
            self._memory_changed.set()

    def _arm(self, slot: ModelSlot) -> None:
        """Unload an idle slot after its keep_alive."""
        if slot._timer is not None:
            slot._timer.cancel()
            slot._timer = None
        slot.expires = None
        if slot.active or slot.keep_alive_s < 0 or not slot.is_loaded:
            return
        if _has_loop():  # else start() arms it
            slot.expires = time.time() + slot.keep_alive_s
            slot._timer = asyncio.get_running_loop().call_later(
                slot.keep_alive_s, self._expire, slot
            )

    def _expire(self, slot: ModelSlot) -> None:
        slot._timer = None
        if slot.active == 0 and slot.is_loaded:
            asyncio.ensure_future(self.unload(slot, f"after {idle_time(slot.keep_alive_s)} idle"))

    async def unload(self, slot: ModelSlot, why: str = "") -> None:
        """Stop its engine (the process exits) and close its vocabulary; its memory is freed.
        `why` ("after 5 min idle", "for qwen") goes in its log line."""
        loaded, prompts = slot.loaded, slot.prompts
        started = time.monotonic()
        if loaded is None or slot.active:
            return
        if slot._timer is not None:
            slot._timer.cancel()
            slot._timer = None
        slot.loaded = slot.prompts = None
        slot.state, slot.reason, slot.since, slot.expires = "unloaded", "", time.time(), None
        if prompts is not None:
            prompts.shutdown()
        await asyncio.get_running_loop().run_in_executor(None, loaded.close)
        give_back_memory()
        took = time.monotonic() - started
        log.info("model %s unloaded%s (%.1f s)", slot.name, f" {why}" if why else "", took)
        self._memory_changed.set()

    async def close(self) -> None:
        """Unload every model but the ones loaded outside the pool's loader (serving() closes
        those); used at shutdown."""
        self._closing = True
        self._memory_changed.set()
        for slot in self.slots.values():
            self._end_turns(slot)  # a request waiting for its turn hears of the shutdown
            if slot._timer is not None:
                slot._timer.cancel()
            if slot.prompts is not None:
                slot.prompts.shutdown()
            if slot.loaded is not None:
                loaded, slot.loaded, slot.state = slot.loaded, None, "unloaded"
                await asyncio.get_running_loop().run_in_executor(None, loaded.close)


@dataclass
class Choice:
    """What choosing a model now costs (`ModelPool.choice`)."""

    swap: list[str] = field(default_factory=list)  # the loaded models its load would unload
    swap_waits: bool = False  # some of those are busy: the load waits for their requests
    too_big: bool = False  # it needs more than the whole memory budget: it cannot load
    load_s: float | None = None  # about how long its load takes (None: loaded, or unknown)
    load_s_from: str = ""  # "last_load" (measured since the start) | "estimate" | ""


def room_for(
    need: int, loaded: list[ModelSlot], budget: int, cap: int
) -> tuple[list[ModelSlot], bool]:
    """What would have to go for a model needing `need` bytes to load beside `loaded` within
    `budget` bytes and `cap` models (0 = no cap): the idle ones to unload, least recently used
    first, and whether even without them it does not fit (busy ones are in the way). ([],
    False): it fits now. Pure: the pool's eviction (`_make_room`) and the picker's
    `choice` both ask it."""
    idle = sorted((s for s in loaded if s.is_loaded and s.active == 0), key=lambda s: s.last_used)
    used, count = sum(s.need_bytes for s in loaded), len(loaded)
    gone: list[ModelSlot] = []
    for s in [None, *idle]:
        if s is not None:
            gone.append(s)
            used, count = used - s.need_bytes, count - 1
        if used + need <= budget and (not cap or count < cap):
            return gone, False
    return gone, True


def idle_time(seconds: float) -> str:
    """A keep_alive as a person says it: "5 min", "1.5 h", "30 s"."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 6 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def give_back_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps what a closed vocabulary
    freed; malloc_trim returns it, so the server's RSS comes back after an unload). A no-op
    where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _has_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _model_path(name: str, model: ModelConfig) -> Path | None:
    """Its GGUF on disk, without fetching anything; None when it is not there."""
    if model.path:
        return Path(model.path).expanduser()
    if not model.embedded:
        return None
    from localserve.runners.models import ensure_embedded

    try:
        return ensure_embedded()
    except Exception:  # noqa: BLE001 (not there: the load says why)
        return None


def _template_source(name: str, model: ModelConfig) -> str | None:
    """A not-yet-loaded model's template text, as the runner would take it (a file's text,
    the configured text or name, else the GGUF header's), without loading it."""
    configured = model.chat_template
    if is_template_file(configured):
        try:
            return Path(configured).expanduser().read_text(encoding="utf-8")
        except OSError:
            return None
    if configured:
        return configured
    from localserve.runners.gguf_header import read_header

    path = _model_path(name, model)
    try:
        return read_header(path).get("tokenizer.chat_template") if path else None
    except (OSError, ValueError):
        return None


def _need(slot: ModelSlot) -> int:
    """A model's memory need in bytes from its GGUF header (footprint.py); 0 when unreadable."""
    from localserve.runners import footprint
    from localserve.runners.gguf_header import read_header

    path = _model_path(slot.name, slot.model)
    if path is None or not path.is_file():
        return 0
    try:
        gpu = footprint.device_available(slot.model.main_gpu) is not None
        cache = footprint.host_cache_bytes(slot.model)  # the engine's RAM: counted without a GPU
        need = footprint.estimate(read_header(path), slot.model, gpu, host_cache=cache)
    except (OSError, ValueError):
        return 0
    return footprint.counted(need, gpu)
