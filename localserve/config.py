"""Configuration: models.toml read into validated msgspec Structs.

Config is data, validated where it is read: an unknown key, a wrong type or an impossible value
raises `ConfigError` naming the key and the problem. Resolving a model to a file on disk lives in
`localserve.runners.models`.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

DEFAULT_MODEL = "gemma-3-270m"
MAX_PARALLEL_SEQUENCES = 256  # llama_max_parallel_sequences() in llama.cpp

Positive = Annotated[int, msgspec.Meta(ge=1)]


KvType = Literal["f16", "q8_0", "q4_0"]
# how a model writes tool calls (localserve/chat/tool_calls/ reads each one)
ToolFormat = Literal["hermes", "llama3", "mistral", "gemma", "deepseek", "generic"]
MAX_DEVICES = 16  # llama.cpp's LLAMA_MAX_DEVICES
MAX_CACHE_MIB = 1 << 20  # a prefix cache tier's largest budget: 1 TiB (more is a typo)


class ConfigError(ValueError):
    """A models.toml entry that cannot be used; the message names the key."""


class ModelConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One model: where its GGUF is and how to run it."""

    path: str | None = None  # a local GGUF file
    embedded: bool = False  # the GGUF shipped by the PyPI package (the default model)
    # how chats become a prompt: "template" = llama.cpp's chat template (chat_template below);
    # "transcript" = a plain "User: ... / Assistant:" dialogue, which base models continue best
    chat_format: Literal["template", "transcript"] = "template"
    # None = the GGUF's own (Jinja, rendered as transformers does); a llama.cpp built-in name
    # ("gemma", "chatml", ...); or a `.jinja` file (relative to models.toml's folder)
    chat_template: str | None = None
    # the system message of chats that bring none; its KV is computed once and shared by every
    # user's requests (None: the transcript format's preamble, no system message for templates)
    system_prompt: str | None = None
    # the tool-call format of the model's replies; "auto" = guessed from its chat template, and
    # "generic" where it shows none (the tools described in a system message, calls as JSON)
    tool_format: ToolFormat | Literal["auto"] = "auto"
    # how its replies mark reasoning ("auto": from the template; "think": <think>...</think>,
    # "magistral": [THINK]...[/THINK]; "none": no split, reasoning stays in the answer)
    reasoning_format: Literal["auto", "none", "think", "magistral"] = "auto"
    n_ctx: Annotated[int, msgspec.Meta(ge=256, le=1 << 20)] = 8192  # KV cells, shared by all
    max_num_seqs: Annotated[int, msgspec.Meta(ge=1, le=MAX_PARALLEL_SEQUENCES)] = 16
    # logit rows a step may add for drafts (speculative decoding), all sequences together: each
    # costs n_vocab floats of memory (1 MiB for Gemma's 262,144 tokens); 0 = no drafts here.
    # 48: with 16 decode rows a step stays at 64 logit rows, past which llama.cpp's CPU path
    # makes every row cost about twice as much (docs/benchmarks.md); a GPU may take more
    draft_rows: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 48
    # sequence ids kept for cached prefixes (finished turns, system prompts) beyond max_num_seqs
    max_cached_prefixes: Annotated[int, msgspec.Meta(ge=0, le=MAX_PARALLEL_SEQUENCES - 1)] = 16
    max_num_batched_tokens: Annotated[int, msgspec.Meta(ge=16, le=8192)] = 512
    n_gpu_layers: Annotated[int, msgspec.Meta(ge=-1)] = -1  # -1 = all layers
    n_threads: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 0  # 0 = every core
    n_threads_batch: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 0  # 0 = n_threads
    flash_attn: Literal["auto", "on", "off"] = "auto"
    # KV cell types: q8_0 halves the cache's memory (about twice the people or context in the
    # same memory), q4_0 quarters it; a quantized V cache needs flash attention
    cache_type_k: KvType = "f16"
    cache_type_v: KvType = "f16"
    offload_kqv: bool = True  # the KV cache and attention on the GPU with the layers
    # several GPUs in one box: "layer" spreads layers (and their KV), "row" splits tensors,
    # "none" keeps everything on main_gpu; tensor_split: each GPU's share, e.g. [3, 1]
    split_mode: Literal["none", "layer", "row"] = "layer"
    tensor_split: Annotated[
        list[Annotated[float, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=MAX_DEVICES)
    ] = msgspec.field(default_factory=list)
    main_gpu: Annotated[int, msgspec.Meta(ge=0, lt=MAX_DEVICES)] = 0
    use_mmap: bool = True  # map the GGUF file instead of reading it into memory
    use_mlock: bool = False  # lock the model's memory so the OS never swaps it out
    # other machines' devices (`localserve worker` there), "host:port": registered before the
    # model loads; n_gpu_layers, split_mode and tensor_split place layers on them as on GPUs
    rpc_workers: Annotated[list[str], msgspec.Meta(max_length=MAX_DEVICES)] = msgspec.field(
        default_factory=list
    )
    # idle time after which the model is unloaded (its engine process exits, its memory is
    # returned): seconds or a duration ("5m", "1h"); -1 = never. A request's own keep_alive
    # (Ollama's field) replaces it after that request, unless it is -1 here.
    keep_alive: float | int | str = 300
    # "embedding": the model serves embeddings only (chats to it are refused); a GGUF that
    # declares a pooling type (nomic, bge, ...) is one whatever this says
    kind: Literal["chat", "embedding"] = "chat"
    # embeddings: the tokens of one step's embedding batch, which is also the longest input
    # (at most n_ctx); the inputs one step embeds; the inputs one request may bring; how the
    # token vectors are pooled ("auto": as the GGUF says, mean when it says nothing)
    max_embed_tokens: Annotated[int, msgspec.Meta(ge=16, le=8192)] = 512
    max_embed_step_inputs: Annotated[int, msgspec.Meta(ge=1, le=MAX_PARALLEL_SEQUENCES)] = 64
    max_embed_inputs: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 2048
    pooling: Literal["auto", "mean", "cls", "last"] = "auto"
    # the prefix cache's tiers below the KV cells (runners/prefix_disk.py): saved conversations'
    # KV state in the engine's RAM (counted in the model's memory need), and on disk under
    # [server] state_dir, kept across restarts. MiB; -1 = auto (host: an eighth of the
    # available RAM, at most 2048; disk: a tenth of the free space there, at most 4096); 0 = off
    host_cache_mib: Annotated[int, msgspec.Meta(ge=-1, le=MAX_CACHE_MIB)] = -1
    disk_cache_mib: Annotated[int, msgspec.Meta(ge=-1, le=MAX_CACHE_MIB)] = -1

    def threads(self) -> tuple[int, int]:
        """(n_threads, n_threads_batch) with 0 resolved to the machine's core count."""
        n = self.n_threads or os.cpu_count() or 1
        return n, self.n_threads_batch or n


class SchedulerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Scheduling policy knobs shared by every model."""

    policy: Literal["continuous", "static"] = "continuous"
    # Keep steps that carry decode tokens within this time; prefill chunks shrink to fit.
    itl_target_ms: Annotated[float, msgspec.Meta(gt=0)] = 120.0
    # Smallest prefill chunk per step while others decode, so long prompts always progress.
    min_prefill_tokens: Positive = 32
    # When several users' long prompts compete or others wait for room, prefill takes more of
    # each step (the streams slow) so every prompt being prefilled gets its first token within this.
    ttft_target_ms: Annotated[float, msgspec.Meta(gt=0)] = 5_000.0
    # Free cells kept back at admission, as a share of the cache, so running decodes can grow.
    kv_watermark: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.02
    max_running_per_user: Positive = 8  # per-user in-flight cap inside the engine
    # Keep finished sequences' KV cells as cached prefixes; a request that starts with one
    # prefills only the rest (LRU, evicted before any live sequence is touched).
    prefix_caching: bool = True
    # Whose cached prefixes a request may reuse: "user" = its own user's and the configured
    # system prompt's (cache timing would reveal other users' prompts); "all" = anyone's.
    share_prefixes: Literal["user", "all"] = "user"
    # A cached prefix whose copy the host tier holds leaves the KV cells while other sequences
    # run: every step attends to every cell in use (others' masked, still computed), so cells
    # kept for someone's next turn slow everyone until then, and the host gives them back in
    # one copy. false: such prefixes stay in the cells until the cells are needed.
    shed_saved_prefixes: bool = True
    # Speculative decoding (engine/speculative.py): "ngram" gives a decoding sequence whose last
    # tokens occurred before in its prompt or reply the tokens that followed them as a draft,
    # verified in the step's batch (more than one token per step where a reply repeats what it
    # was given; greedy replies stay the same token for token, sampled ones keep their
    # distribution); drafts are taken only where they are expected to pay. "off": none.
    speculative: Literal["ngram", "off"] = "ngram"
    # draft tokens per sequence and step, at most: a sequence starts at 8 and doubles while its
    # drafts are kept whole (a reply copying a long stretch), falling back after one that fails
    max_draft_tokens: Annotated[int, msgspec.Meta(ge=0, le=256)] = 48
    # Whether a sampled request with a seed drafts. A seed asks for the same reply each time,
    # and it is, from the same numerics; a drafted step has other rows, so its logits differ in
    # the last bits, and which steps draft depends on what the server has learned from everyone
    # (acceptance, step costs): a draw near a boundary can then go the other way. false: such
    # a request never drafts (greedy ones and unseeded ones do); true: it drafts too, and its
    # reply is the same only in distribution.
    draft_seeded: bool = False


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The websocket server's limits (command-line flags override host and port)."""

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8765
    # the longest frame a client may send (~60,000 tokens of English; raise it for huge n_ctx)
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 << 20)] = 256 << 10
    max_tokens: Positive = 4096  # cap on a request's max_tokens
    # an OpenAI API request without max_tokens generates at most this many (lowered to
    # max_tokens): the chat page's default reply length. Without it a model that never stops
    # (the embedded base model loops) would fill the whole cap.
    default_max_tokens: Positive = 1024
    max_queued: Positive = 64  # requests waiting for admission, all users together
    max_queued_per_user: Positive = 16
    max_inflight_per_user: Positive = 8  # waiting + running, per user
    shutdown_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # What one connection may pin: frames waiting to be sent to it, in bytes (a client that
    # stops reading reaches this and is closed with 1008, its requests cancelled) ...
    max_outbox_bytes: Annotated[int, msgspec.Meta(ge=256 << 10, le=64 << 20)] = 256 << 10
    # ... a socket that takes nothing for this long is closed the same way ...
    write_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    # ... and so is one that does not answer a ping (sent this often) within this long.
    keepalive_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    max_connections: Positive = 64  # websockets past hello; beyond it, a new one gets 503
    # websockets one user holds past hello (the name a token proves; on an open server the name
    # in hello); beyond it, that user's next hello is refused (busy), nobody else's.
    # 0 = a quarter of max_connections, at least 1
    max_connections_per_user: Annotated[int, msgspec.Meta(ge=0)] = 0
    # failed hellos (per user), subscribes and /metrics tokens (the monitor's) per place and
    # minute; beyond it that credential is refused from there until the failures age out
    max_auth_failures_per_minute: Positive = 10
    # Front-ends a household reaches the server through (Open WebUI): users of the users file
    # (their tokens are the front-ends' API keys) that may say on whose behalf they ask, with
    # X-Localserve-User or Open WebUI's X-OpenWebUI-User-Name/-Id; the request is then the user
    # "<frontend>/<person>" ("openwebui/alice": quotas, usage, fairness, prefix isolation of its
    # own; daily_tokens_per_user takes such names). Headers from anyone else are ignored. Who is
    # who (each id's name) is kept in state_dir/people.sqlite3 across restarts (ops/people.py);
    # one front-end names at most max_people_per_frontend people, those kept included; a new one
    # past it is refused (serve/trusted_proxies.py).
    trusted_frontends: list[str] = msgspec.field(default_factory=list)
    max_people_per_frontend: Positive = 256
    # A people.sqlite3 that names nobody while the usage record has requests of a trusted
    # front-end's people was lost: the server refuses to start (their names would be free for
    # whoever sends them first). true: start anyway, each name new again.
    forget_lost_people: bool = False
    # Running it for a team (usage.py). State: the usage database and the access log live in
    # state_dir ("" = $LOCALSERVE_STATE_DIR, else $XDG_STATE_HOME/localserve, else
    # ~/.local/state/localserve); usage = false records nothing. A server with users keeps its
    # monitor token there too, unless the users file's [monitor] table sets one
    # (ops/monitor_token.py): no models.toml key, a secret belongs with the users' tokens.
    state_dir: str = ""
    usage: bool = True
    # The chat page's conversations on a server with users (ops/conversations.py): kept in the
    # state_dir, per person, so they follow the person to another browser; at most this many
    # conversations and bytes of them each (a save past either is refused, nothing is deleted).
    # false, or a server without users: the page keeps them in the browser.
    conversations: bool = True
    max_conversations_per_user: Positive = 1000
    max_conversation_bytes_per_user: Annotated[int, msgspec.Meta(ge=64 << 10)] = 64 << 20
    # The Responses API's stored responses (ops/responses_store.py, `store`: true): kept in the
    # state_dir per person, so `previous_response_id` can continue them; at most this many and
    # bytes of them each, the oldest dropped to make room; and at most max_responses and
    # max_response_bytes of them all together, everyone's oldest dropped first (an open server
    # has as many people as names invented; the disk is the usage record's too). false: nothing
    # is stored (a request with store or previous_response_id is then refused).
    responses_store: bool = True
    max_responses_per_user: Positive = 1000
    max_response_bytes_per_user: Annotated[int, msgspec.Meta(ge=64 << 10)] = 64 << 20
    max_responses: Positive = 20_000
    max_response_bytes: Annotated[int, msgspec.Meta(ge=64 << 10)] = 1 << 30
    # daily token quotas (prompt tokens computed + tokens generated, from local midnight): a
    # default for everyone (0 = none) and per user (a users file's [daily_tokens] adds to these)
    daily_tokens: Annotated[int, msgspec.Meta(ge=0)] = 0
    daily_tokens_per_user: dict[str, Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(
        default_factory=dict
    )
    # one line per finished request: "auto" = off on loopback, state_dir/access.log when
    # serving a network; "off"; or a file's path. Rotated at access_log_max_bytes.
    access_log: str = "auto"
    access_log_format: Literal["plain", "json"] = "plain"
    access_log_max_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 10 << 20
    access_log_backups: Annotated[int, msgspec.Meta(ge=0, le=100)] = 5
    # The engine (llama.cpp) runs in a process of its own, watched (engine_process/): when it
    # dies or a step takes longer than its limit (or loading, load_timeout_s), requests in
    # flight fail, new ones are refused, and it is restarted once its RPC workers answer. A
    # step's limit is step_timeout_s + 3 x its expected time (the engine's cost model for its
    # decode and prompt tokens, learned from this machine's steps, times the largest recent
    # ratio of a step's time to its prediction); 3 x step_timeout_s + 3 x expected for a step
    # of a kind not measured since the start (engine_process/step_clock.py).
    # engine_process = false runs it in the server's process (a llama.cpp abort ends the server).
    engine_process: bool = True
    step_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    load_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 600.0
    # Browsers (auth.browser_refusal): the names a browser may call this server by, besides IP
    # addresses and localhost (e.g. "homeserver.local", "chat.example.org") ...
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    # ... and web pages elsewhere that may use its websocket and HTTP API, with CORS (origins,
    # e.g. "https://chat.example.org", "chrome-extension://<id>"); its own page always may
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    # A chat (websocket or /v1/chat/completions) whose prompt plus its reply's max_tokens does not
    # fit the model's n_ctx: "truncate" leaves out its oldest turns (never a system prompt, never
    # the newest user turn; the reply says how many messages: `dropped_messages`) until there is
    # room for max_tokens (at most half of n_ctx); when even those two leave less, the reply
    # gets the rest of the context. "refuse": a prompt that does not fit is refused (too_long,
    # context_length_exceeded). Raw completions (/v1/completions) are always refused.
    context_overflow: Literal["truncate", "refuse"] = "truncate"
    # Several models (serve/pool.py): the memory loaded models may use together, in MiB (0 =
    # what runners/footprint.py finds available, the GPU's free memory or the RAM, less its
    # reserve), and how many may be loaded at once (0 = as many as fit)
    memory_budget_mib: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_loaded_models: Annotated[int, msgspec.Meta(ge=0)] = 0
    # a person's loads that evict a model someone else used within the last minute: at most
    # this many a minute; past it their load waits (told why), so one person flipping models
    # cannot make everyone's next request wait for a load (serve/swaps.py; 0 = no bound)
    max_swaps_per_person: Annotated[int, msgspec.Meta(ge=0)] = 2
    # A request waiting for its model (a load, or its turn while another model's load waits for
    # this busy one to drain) is refused (unavailable) past this many seconds
    max_model_wait_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 300.0

    @property
    def connections_per_user(self) -> int:
        """max_connections_per_user, 0 resolved: one user never holds every websocket."""
        return self.max_connections_per_user or max(1, self.max_connections // 4)

    def __post_init__(self) -> None:
        if not self.usage and (self.daily_tokens or any(self.daily_tokens_per_user.values())):
            raise ValueError("daily_tokens: quotas are counted in the usage record: usage = true")
        # compared as browsers send them
        self.allowed_hosts = [h.strip().lower().rstrip(".") for h in self.allowed_hosts]
        origins = [o.strip().lower().rstrip("/") for o in self.allowed_origins]
        for origin in origins:
            scheme, sep, rest = origin.partition("://")
            if scheme not in ORIGIN_SCHEMES or not sep or not rest or "/" in rest:
                raise ValueError(f"allowed_origins: {origin!r} is not an origin like https://host")
        self.allowed_origins = origins


# web pages, and browser extensions (their pages and workers send these origins)
ORIGIN_SCHEMES = ("http", "https", "chrome-extension", "moz-extension", "safari-web-extension")


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole of models.toml."""

    # the model served when a request names none; unset: the embedded one when the file names
    # it (or names no model at all), else the first model the file names
    default: str = DEFAULT_MODEL
    models: dict[str, ModelConfig] = msgspec.field(default_factory=dict)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)


# said where a name asked for is the embedded model's but models.toml names other models only
EMBEDDED_HINT = (
    f"; the embedded {DEFAULT_MODEL} is served only when models.toml names it "
    f"([models.{DEFAULT_MODEL}] embedded = true) or names no model"
)


def builtin_config() -> Config:
    """The configuration used when no models.toml exists: the embedded default model."""
    default = ModelConfig(
        embedded=True, chat_format="transcript", chat_template="gemma", keep_alive=-1
    )
    return Config(models={DEFAULT_MODEL: default})


def loads_toml(text: str, source: str) -> dict:
    """TOML text as a dict; a ConfigError naming `source` when it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None


def parse_config(text: str, source: str = "models.toml") -> Config:
    """Parse and validate TOML text; errors name the offending key."""
    raw = loads_toml(text, source)
    models = raw.pop("models", {})
    if not isinstance(models, dict):
        raise ConfigError(f"{source}: models: expected a table of models")
    config = _convert(raw, Config, "", source)
    # one model at a time, so an error can name the model (msgspec writes dict keys as [...])
    config.models = {
        name: _convert(entry, ModelConfig, f"models.{name}", source)
        for name, entry in models.items()
    }
    if not config.models:  # a file that names no model serves the embedded one
        config.models = builtin_config().models
    for name, model in config.models.items():
        check_model(name, model, source)
    if "default" not in raw and DEFAULT_MODEL not in config.models:
        config.default = next(iter(config.models))  # the first model the file names
    if config.default not in config.models:
        known = ", ".join(sorted(config.models))
        hint = EMBEDDED_HINT if config.default == DEFAULT_MODEL else ""
        raise ConfigError(
            f"{source}: default: unknown model {config.default!r} (known: {known}){hint}"
        )
    sched = config.scheduler
    if sched.ttft_target_ms <= sched.itl_target_ms:
        raise ConfigError(
            f"{source}: scheduler.ttft_target_ms ({sched.ttft_target_ms:g}) must be above "
            f"itl_target_ms ({sched.itl_target_ms:g}): a first token takes at least one step"
        )
    return config


def configured_model(config: Config, name: str | None, key: str = "model") -> str:
    """`name` (the default when None) if `config` has it; else ConfigError naming `key`, the
    configured models and, for the embedded model's name, how to serve it."""
    name = name or config.default
    if name not in config.models:
        known = ", ".join(sorted(config.models))
        hint = EMBEDDED_HINT if name == DEFAULT_MODEL else ""
        raise ConfigError(f"{key}: unknown model {name!r} (models.toml has: {known}){hint}")
    return name


def config_path(path: str | os.PathLike | None = None) -> Path | None:
    """The file load_config reads: `path`, $LOCALSERVE_MODELS or ./models.toml; None when
    there is none of them (the built-in configuration)."""
    candidate = path or os.environ.get("LOCALSERVE_MODELS")
    if candidate is None and Path("models.toml").is_file():
        candidate = "models.toml"
    return None if candidate is None else Path(candidate)


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read models.toml from `path`, $LOCALSERVE_MODELS or ./models.toml; built-ins otherwise."""
    p = config_path(path)
    if p is None:
        return builtin_config()
    if not p.is_file():
        raise ConfigError(f"{p}: no such configuration file")
    config = parse_config(p.read_text(encoding="utf-8"), str(p))
    # relative model paths are relative to the file that names them
    for name, model in config.models.items():
        if model.path and not Path(model.path).expanduser().is_absolute():
            model.path = str((p.parent / model.path).resolve())
        if is_template_file(model.chat_template):
            template = Path(model.chat_template).expanduser()
            model.chat_template = str(template if template.is_absolute() else p.parent / template)
            if not Path(model.chat_template).is_file():
                raise ConfigError(
                    f"{p}: models.{name}.chat_template: no such file: {model.chat_template}"
                )
    return config


def is_template_file(chat_template: str | None) -> bool:
    """Whether models.toml's chat_template names a `.jinja` file (else a name or Jinja text)."""
    return bool(chat_template) and chat_template.lower().endswith(".jinja")


def check_model(name: str, model: ModelConfig, source: str) -> None:
    """Cross-field checks msgspec constraints cannot express."""
    key = f"models.{name}"
    if model.embedded == bool(model.path):
        raise ConfigError(f"{source}: {key}: set exactly one of `path` or `embedded = true`")
    if model.max_num_batched_tokens < model.max_num_seqs:
        raise ConfigError(
            f"{source}: {key}.max_num_batched_tokens: {model.max_num_batched_tokens} is below "
            f"max_num_seqs ({model.max_num_seqs}); every running sequence needs one decode "
            "token per step"
        )
    if model.max_embed_tokens > model.n_ctx:
        raise ConfigError(
            f"{source}: {key}.max_embed_tokens: {model.max_embed_tokens} is above n_ctx "
            f"({model.n_ctx})"
        )
    if model.cache_type_v != "f16" and model.flash_attn == "off":
        raise ConfigError(
            f"{source}: {key}.cache_type_v: a {model.cache_type_v} V cache needs flash attention; "
            'set flash_attn = "auto" or "on", or cache_type_v = "f16"'
        )
    if model.tensor_split and not sum(model.tensor_split) > 0:
        raise ConfigError(f"{source}: {key}.tensor_split: give at least one GPU a share above 0")
    for endpoint in model.rpc_workers:
        if not parse_endpoint(endpoint):
            raise ConfigError(
                f"{source}: {key}.rpc_workers: {endpoint!r} is not host:port (e.g. 10.0.0.5:50052)"
            )
    if len(set(model.rpc_workers)) != len(model.rpc_workers):
        raise ConfigError(f"{source}: {key}.rpc_workers: a worker is listed twice")
    try:
        parse_keep_alive(model.keep_alive, f"{key}.keep_alive")
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    if model.max_num_seqs + model.max_cached_prefixes > MAX_PARALLEL_SEQUENCES:
        raise ConfigError(
            f"{source}: {key}.max_cached_prefixes: max_num_seqs + max_cached_prefixes must be at "
            f"most {MAX_PARALLEL_SEQUENCES} (llama.cpp's sequence ids)"
        )


def parse_keep_alive(value: float | int | str, where: str = "keep_alive") -> float:
    """Seconds from a number or a duration ("300", "5m", "1h30m", "-1"); < 0 = never unload.
    ValueError naming `where` for anything else."""
    if isinstance(value, bool):
        raise ValueError(f'{where}: seconds or a duration like "5m", not {value!r}')
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            seconds = float(text)
        elif m := re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", text or "x"):
            h, mi, s = (float(g) if g else 0.0 for g in m.groups())
            seconds = h * 3600 + mi * 60 + s
        else:
            raise ValueError(f'{where}: {text[:40]!r} is not seconds or a duration like "5m"')
    if math.isnan(seconds) or seconds > 365 * 86400:
        raise ValueError(f"{where}: at most a year")
    return -1.0 if seconds < 0 else seconds


def parse_endpoint(endpoint: str) -> tuple[str, int] | None:
    """("host", port) from "host:port" or "[v6]:port"; None when it is neither."""
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if any(c.isspace() or c in "/[]" for c in host):
        return None
    return host, int(port)


def _convert(raw: object, kind: type, prefix: str, source: str):
    """msgspec.convert with errors rewritten as `source: key: problem`."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as e:
        message, _, where = str(e).partition(" - at `$")
        key = prefix + where.rstrip("`")
        unknown = re.fullmatch(r"Object contains unknown field `(.+)`", message)
        if unknown:
            key = f"{key}.{unknown.group(1)}".lstrip(".")
            raise ConfigError(f"{source}: `{key}`: unknown key") from None
        raise ConfigError(f"{source}: `{key.lstrip('.') or '(top level)'}`: {message}") from None
