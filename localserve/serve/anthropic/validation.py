"""What every Anthropic request is checked for before admission: its user, its body, its model,
and its sampling fields as the server's.

The user comes first, before the body is read: `x-api-key` (Anthropic's header) or
`Authorization: Bearer` (what Claude Code's ANTHROPIC_AUTH_TOKEN sends) names them on a server
with tokens (failures throttled like any token check); on an open server every Anthropic
request is DEFAULT_USER's. The body is read bounded in bytes (max_frame_bytes) and in time
(serve/http_body.py); the model must be this server's (a 404 naming it otherwise). `max_tokens` is
required (as Anthropic has it) and capped by the server's max_tokens.

Tested in tests/e2e/test_anthropic_api.py; on a fake Frontdoor in tests/unit/serve/anthropic/.
"""

from __future__ import annotations

from typing import Any, TypeVar

from starlette.requests import Request as HttpRequest

from localserve.engine.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from localserve.protocol.frames import SamplingFields
from localserve.serve.anthropic.errors import AnthropicError, dotted, invalid, retry_after
from localserve.serve.anthropic.types import MessagesRequest
from localserve.serve.door import Frontdoor
from localserve.serve.http_body import BodyProblem, read_json
from localserve.serve.transport import bearer_token, client_address
from localserve.serve.trusted_proxies import PersonRefused, on_behalf_of

DEFAULT_USER = "anthropic"  # the user of an open server's Anthropic requests

Body = TypeVar("Body")


async def identify(door: Frontdoor, request: HttpRequest) -> str:
    """The user: the API key's owner (a server with tokens; or the person a trusted front-end
    names, serve/trusted_proxies.py), else DEFAULT_USER."""
    access = door.access
    if not access.requires_tokens:
        return DEFAULT_USER
    token = request.headers.get("x-api-key") or bearer_token(request)
    user = access.user_for_token(token)
    refused = await door.authenticate(
        client_address(request.scope), "api key", token, user is not None, "invalid API key"
    )
    if refused is not None and refused.retry_after_s:
        raise AnthropicError(429, refused.message, retry_after(refused.retry_after_s))
    if refused is not None:
        raise AnthropicError(
            401, "invalid x-api-key: give a user's token as the API key (x-api-key: <token>)"
        )
    try:  # a trusted front-end (Open WebUI, a gateway) may name the person it asks for
        return await on_behalf_of(door, request, user)
    except PersonRefused as e:
        wait = retry_after(e.retry_after_s) if e.retry_after_s else None
        raise AnthropicError(e.status, e.message, wait) from None


async def read_body(door: Frontdoor, request: HttpRequest, kind: type[Body]) -> Body:
    """The request's JSON, bounded in bytes and time, as `kind`; 400/408/413 otherwise."""
    try:
        return await read_json(request, door.config.max_frame_bytes, kind)
    except BodyProblem as e:
        if e.invalid is not None:
            raise AnthropicError(400, _named(str(e.invalid))) from None
        raise AnthropicError(e.status, e.message) from None


def _named(message: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.messages[0].content`" as Anthropic says it:
    "messages.0.content: Expected `int`, got `str`" ("field required:" for a missing one)."""
    message = message.replace("Object missing required field", "field required:")
    what, sep, path = message.rpartition(" - at `$.")
    return f"{dotted(path.rstrip('`'))}: {what}" if sep else f"invalid request: {message}"


def check_model(door: Frontdoor, model: str) -> Frontdoor:
    """The door of `model`; a 404 naming the server's models unless it is one of them."""
    if model not in door.model_names:
        names = ", ".join(repr(n) for n in door.model_names)
        raise AnthropicError(404, f"model: {model[:100]!r} not found; this server has {names}")
    return door.model(model)


def sampling_fields(door: Frontdoor, body: MessagesRequest) -> SamplingFields:
    """The one sampling definition from the request: max_tokens (required, at least 1, at most
    the server's), stop_sequences, temperature, top_p, top_k; the rest the defaults."""
    cap = door.config.max_tokens
    if body.max_tokens < 1:
        raise invalid("max_tokens", "at least 1")
    given: dict[str, Any] = {"max_tokens": min(body.max_tokens, cap)}
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(body, name)
        if value is not None:
            given[name] = value
    stops = body.stop_sequences or []
    if len(stops) > MAX_STOP_STRINGS or not all(0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise invalid(
            "stop_sequences", f"at most {MAX_STOP_STRINGS}, each 1-{MAX_STOP_CHARS} characters"
        )
    given["stop"] = stops
    return SamplingFields(**given)
