"""What every Ollama request is checked for before admission: its body, its model, its user,
and how its fields map to the server's (`options` to the sampling fields, `format` to a
response_format, `think` to the template's enable_thinking).

The body is read bounded in bytes (max_frame_bytes) and in time (serve/http_body.py) and decoded
into its endpoint's type; the model, when named, must be this server's (with or without
Ollama's ":latest" tag). `Authorization: Bearer` names the user on a server with tokens
(failures throttled like any token check; a trusted front-end's may name a person behind it:
trusted_proxies.py); on an open server every Ollama request is
DEFAULT_USER's (Ollama's API names no user).

Tested in tests/e2e/test_ollama_api.py; on a fake Frontdoor in tests/unit/serve/ollama/.
"""

from __future__ import annotations

from typing import Any, TypeVar

from starlette.requests import Request as HttpRequest

from localserve.config import parse_keep_alive
from localserve.protocol.frames import SamplingFields
from localserve.serve.door import Frontdoor
from localserve.serve.http_body import BodyProblem, read_json
from localserve.serve.ollama.errors import OllamaError, retry_after
from localserve.serve.ollama.types import OllamaFields, Options
from localserve.serve.transport import bearer_token, client_address
from localserve.serve.trusted_proxies import PersonRefused, on_behalf_of

DEFAULT_USER = "ollama"  # the user of an open server's Ollama requests
TAG = ":latest"  # Ollama's default tag: "gemma-3-270m" and "gemma-3-270m:latest" are one model
THINK_LEVELS = ("low", "medium", "high")

Body = TypeVar("Body")


async def read_body(door: Frontdoor, request: HttpRequest, kind: type[Body]) -> Body:
    """The request's JSON, bounded in bytes and time, as `kind`; 400/408/413 otherwise."""
    try:
        return await read_json(request, door.config.max_frame_bytes, kind)
    except BodyProblem as e:
        raise OllamaError(e.status, e.message) from None


def public_name(door: Frontdoor | str) -> str:
    """A model's name as Ollama clients see it: tagged (":latest" unless it has a tag)."""
    name = door if isinstance(door, str) else door.model_name
    return name if ":" in name else name + TAG


def check_model(door: Frontdoor, model: str | None) -> Frontdoor:
    """The door of `model` (tagged or not; None: the default); a 404 naming the server's
    models unless it is one of them."""
    if model is None:
        return door.model(None)
    for name in door.model_names:
        if model in (name, public_name(name)):
            return door.model(name)
    names = ", ".join(repr(public_name(n)) for n in door.model_names)
    raise OllamaError(404, f"model {model[:100]!r} not found; this server has {names}")


async def identify(door: Frontdoor, request: HttpRequest) -> str:
    """The user: the bearer token's owner (a server with tokens; a trusted front-end's person,
    by header), else DEFAULT_USER."""
    access = door.access
    if not access.requires_tokens:
        return DEFAULT_USER
    token = bearer_token(request)
    user = access.user_for_token(token)
    refused = await door.authenticate(
        client_address(request.scope), "api key", token, user is not None, "invalid API key"
    )
    if refused is not None and refused.retry_after_s:
        raise OllamaError(429, refused.message, retry_after(refused.retry_after_s))
    if refused is not None:
        raise OllamaError(
            401,
            "unauthorized: give a user's token as the API key (Authorization: Bearer <token>)",
            {"WWW-Authenticate": 'Bearer realm="localserve"'},
        )
    try:
        return await on_behalf_of(door, request, user)
    except PersonRefused as e:
        wait = retry_after(e.retry_after_s) if e.retry_after_s else None
        raise OllamaError(e.status, e.message, wait) from None


def sampling_fields(options: Options | None, default_max: int, cap: int) -> SamplingFields:
    """The one sampling definition from Ollama's options: those not given keep the defaults;
    num_predict not given is `default_max`, and -1 or -2 ("no limit", "fill the context") is
    the server's cap."""
    given: dict[str, Any] = {"max_tokens": default_max}
    if options is not None:
        for name in SamplingFields.__struct_fields__:
            value = getattr(options, name, None)
            if value is not None:
                given[name] = value
        if options.num_predict is not None:
            given["max_tokens"] = cap if options.num_predict in (-1, -2) else options.num_predict
    return SamplingFields(**given)


def response_format(fmt: str | dict | None) -> dict | None:
    """Ollama's `format` as OpenAI's response_format: "json" any JSON object, an object a JSON
    schema (admission checks and compiles it); "" or null none."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise OllamaError(400, f'format: "json" or a JSON schema object, not {fmt[:40]!r}')


def template_kwargs(think: bool | str | None) -> dict | None:
    """`think` as the template's switch: true (or a level) enable_thinking, false not; None
    leaves the template's default."""
    if think is None:
        return None
    if isinstance(think, str) and think not in THINK_LEVELS:
        raise OllamaError(400, f"think: true, false or one of {', '.join(THINK_LEVELS)}")
    return {"enable_thinking": think is not False}


def check_common(door: Frontdoor, body: OllamaFields) -> tuple[Frontdoor, float | None]:
    """The model's door, and `keep_alive` in seconds (None: the model's own; < 0: never
    unload; 0: unload after this reply), from a number or a duration such as "5m"."""
    door = check_model(door, body.model)
    keep = body.keep_alive
    if keep is None:
        return door, None
    if isinstance(keep, str) and len(keep) > 32:
        raise OllamaError(400, 'keep_alive: a duration such as "5m" or a number of seconds')
    try:
        return door, parse_keep_alive(keep)
    except ValueError as e:
        raise OllamaError(400, str(e)) from None
