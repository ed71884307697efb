"""What every OpenAI request is checked for before admission: its body, its model, its user.

The body is read bounded in bytes (max_frame_bytes) and in time (serve/http_body.py) and decoded
into its endpoint's type; the model, when named, must be this server's. The API key
(`Authorization: Bearer`) names the user on a server with tokens (failures throttled like any
token check; a trusted front-end's key may name a person behind it: trusted_proxies.py); on an open
server the `user` field does (DEFAULT_USER when absent). Fields that would change the output
and are not supported are refused with a 400 that names them.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec
from starlette.requests import Request as HttpRequest

from localserve.ops.auth import check_user_name
from localserve.protocol.frames import SAMPLING_FIELDS, SamplingFields
from localserve.serve.door import Frontdoor
from localserve.serve.http_body import BodyProblem, read_json
from localserve.serve.openai.errors import CHALLENGE, ApiError, retry_after, unsupported
from localserve.serve.openai.types import RequestFields
from localserve.serve.transport import bearer_token, client_address
from localserve.serve.trusted_proxies import PersonRefused, on_behalf_of

DEFAULT_USER = "api"  # the user of an open server's HTTP requests that name none

Body = TypeVar("Body", bound=RequestFields)


async def read_body(door: Frontdoor, request: HttpRequest, kind: type[Body]) -> Body:
    """The request's JSON, bounded in bytes and time, as `kind`, naming this server's model;
    400/404/408/413 otherwise."""
    try:
        body = await read_json(request, door.config.max_frame_bytes, kind)
    except BodyProblem as e:
        param = _param(e.invalid) if e.invalid is not None else None
        raise ApiError(e.status, e.message, e.code, param) from None
    check_model(door, body.model)
    return body


def check_model(door: Frontdoor, model: str | None) -> Frontdoor:
    """The door of `model` (None: the default); a 404 naming the server's models unless it is
    one of them."""
    if model is not None and model not in door.model_names:
        names = ", ".join(repr(n) for n in door.model_names)
        message = (
            f"the model {model[:100]!r} does not exist here; this server has "
            f"{names} (GET /v1/models)"
        )
        raise ApiError(404, message, "model_not_found", "model")
    return door.model(model)


async def identify(door: Frontdoor, request: HttpRequest, named: str | None) -> str:
    """The user: the API key's owner (a server with tokens; a trusted front-end's person, by
    header), else the `user` field."""
    access = door.access
    if access.requires_tokens:
        token = bearer_token(request)
        user = access.user_for_token(token)
        refused = await door.authenticate(
            client_address(request.scope), "api key", token, user is not None, "invalid API key"
        )
        if refused is not None and refused.retry_after_s:
            wait = retry_after(refused.retry_after_s)
            raise ApiError(
                429, refused.message, "rate_limit_exceeded", None, "rate_limit_error", wait
            )
        if refused is not None:
            message = (
                "invalid API key: give a user's token as the API key "
                "(Authorization: Bearer <token>)"
            )
            raise ApiError(401, message, "invalid_api_key", headers=CHALLENGE)
        try:
            return await on_behalf_of(door, request, user)
        except PersonRefused as e:
            raise _person_refused(e) from None
    name = DEFAULT_USER if named is None else named
    if not check_user_name(name):
        raise ApiError(
            400, "user: 1-64 printable characters, no outer spaces", "invalid_value", "user"
        )
    return name


def _person_refused(e: PersonRefused) -> ApiError:
    if e.retry_after_s:  # a new person the server cannot record now
        wait = retry_after(e.retry_after_s)
        return ApiError(e.status, e.message, "unavailable", e.header, "server_error", wait)
    code = "invalid_value" if e.status == 400 else "permission_denied"
    return ApiError(e.status, e.message, code, e.header)


def sampling_fields(body: RequestFields, max_tokens: int | None, default: int) -> SamplingFields:
    """The one sampling definition from an OpenAI body: fields not given keep the defaults;
    `max_tokens` not given is `default` (the server's default_max_tokens, at most its cap)."""
    given = {name: getattr(body, name, None) for name in SAMPLING_FIELDS}
    given["max_tokens"] = default if max_tokens is None else max_tokens
    if isinstance(body.stop, str):
        given["stop"] = [body.stop]
    return SamplingFields(**{k: v for k, v in given.items() if v is not None})


def refuse_unsupported(body: RequestFields) -> None:
    """The fields both endpoints refuse (each endpoint checks its own too)."""
    if body.n not in (None, 1):
        raise unsupported("n", "more than one choice")
    if body.logit_bias:
        raise unsupported("logit_bias", "a logit bias")


def _param(error: msgspec.ValidationError) -> str | None:
    """The field a msgspec error names (`... - at `$.messages[0].role``)."""
    text = str(error)
    _, sep, path = text.rpartition("at `$.")
    return path.rstrip("`") if sep else None
