"""`POST /v1/responses`: input items in (continuing a stored response, or not), a response out.

The body is read and its user named as the OpenAI API's (serve/openai/validation.py: bounded,
the API key's owner or a trusted front-end's person), checked (checks.py), its input and the
chain of `previous_response_id` made the chat's messages (items.py), and handed to admission
as a chat completion is (`HttpReply.submit`: the same limits, fairness, quotas, prefix
isolation and too-long check); the reply is reply.py's. `previous_response_id` is looked up
among the same person's stored responses only: another person's id is a 404 as an unknown one
is. A chain past MAX_CHAIN_DEPTH responses, or whose turns are more bytes than one request's
body may be (max_frame_bytes), is a 400 that names the bound, decided from the named response's
row without walking the chain.

Tested in tests/unit/serve/responses/test_create.py and tests/e2e/test_responses_api.py.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.chat.messages import PromptMessage
from localserve.ops.responses_store import (
    ChainBroken,
    ChainTooDeep,
    ChainTooLarge,
    ResponseStore,
    ResponseStoreError,
    StoredResponse,
)
from localserve.serve.door import Frontdoor, Refusal
from localserve.serve.openai import errors
from localserve.serve.openai.errors import ApiError
from localserve.serve.openai.validation import identify, read_body
from localserve.serve.responses import checks, items
from localserve.serve.responses.output import new_id
from localserve.serve.responses.reply import Keep, ResponseReply, envelope
from localserve.serve.responses.types import ResponsesRequest

log = logging.getLogger("localserve.serve.responses")

MAX_CHAIN_DEPTH = 100  # responses in one chain of previous_response_id
MAX_RESPONSE_ID_CHARS = 128

_encode = msgspec.json.Encoder().encode


def not_found(id: str, param: str | None = None) -> ApiError:
    """An id the person has no response of (theirs unknown, or another person's)."""
    what = f"{param}: " if param else ""
    return ApiError(404, f"{what}no response {id[:64]!r} of yours is stored here", "not_found",
                    param)  # fmt: skip


def store_failed(e: ResponseStoreError) -> ApiError:
    return ApiError(503, str(e), "unavailable", None, "server_error", errors.retry_after(5))


async def create_response(door: Frontdoor, store: ResponseStore | None, request: HttpRequest):
    body = await read_body(door, request, ResponsesRequest)
    door = door.model(body.model)  # checked by read_body: one of the server's
    checks.refuse_unsupported(body)
    user = await identify(door, request, body.user)
    turns = items.input_turns(items.input_items(body.input))
    chain = await _chain(store, user, body.previous_response_id, door.config.max_frame_bytes)
    messages = items.chat_messages(body.instructions, chain.messages, turns)
    fmt = checks.text_format(body)
    use = await checks.tools_of(door, body, fmt is not None)
    constraint = use.constraint or await checks.format_constraint(door, fmt)
    config = door.config
    fields = checks.sampling_fields(body, min(config.default_max_tokens, config.max_tokens))
    keeps = store is not None and body.store is not False
    id = new_id("resp")
    shape = envelope(id, door.model_name, body, fields, body.tools, body.previous_response_id,
                     keeps)  # fmt: skip
    keep = _keeper(store, user, shape, body, turns.messages, chain) if keeps else None
    reply = ResponseReply(door, request.scope, bool(body.stream), shape, user, use, keep)
    extras = use.extras
    try:
        admitted = await reply.submit(
            request.receive,
            door.next_number(),
            fields,
            lambda prompts, reply_tokens: prompts.chat(messages, reply_tokens, extras),
            constraint=constraint,
        )
    except Refusal as e:
        error = errors.refused(e, "chat")
        if e.code == "too_long":
            error.param = "input"
        raise error from None
    if admitted is None:  # the client left while its prompt was built
        return Response(status_code=499)
    reply.request = admitted
    return reply


class Continued(NamedTuple):
    """The chain a request continues: its messages, how many responses and bytes it is."""

    messages: list[PromptMessage]
    depth: int = 0
    bytes: int = 0


async def _chain(
    store: ResponseStore | None, user: str, previous: str | None, max_bytes: int
) -> Continued:
    """The person's chain that `previous` ends (none: empty), within the bounds: at most
    MAX_CHAIN_DEPTH responses and `max_bytes` of turns, the size one request's body may be."""
    if previous is None:
        return Continued([])
    param = "previous_response_id"
    if store is None:
        message = (f"{param}: this server keeps no responses ([server] responses_store = "
                   "false): send the whole conversation as input")  # fmt: skip
        raise ApiError(400, message, "invalid_value", param)
    if len(previous) > MAX_RESPONSE_ID_CHARS:
        raise not_found(previous, param)
    try:
        found = await store.chain(user, previous, MAX_CHAIN_DEPTH, max_bytes)
    except KeyError:
        raise not_found(previous, param) from None
    except ChainTooDeep as e:
        message = (f"{param}: {previous[:64]!r} ends a chain of {e.depth} responses, and "
                   f"a chain is at most {e.max_depth} long: send the conversation as input "
                   "instead")  # fmt: skip
        raise ApiError(400, message, "chain_too_deep", param) from None
    except ChainTooLarge as e:
        message = (f"{param}: {previous[:64]!r} ends a conversation of {e.size} bytes, over "
                   f"the {e.max_bytes} one request may carry ([server] max_frame_bytes): send a "
                   "shorter conversation as input instead")  # fmt: skip
        raise ApiError(400, message, "chain_too_large", param) from None
    except ChainBroken as e:
        raise ApiError(400, f"{param}: {e}", "invalid_value", param) from None
    except ResponseStoreError as e:
        raise store_failed(e) from None
    messages = [m for turns in found.turns for m in items.decode_turns(turns)]
    return Continued(messages, found.depth, found.bytes)


def _keeper(
    store: ResponseStore,
    user: str,
    shape: dict,
    body: ResponsesRequest,
    turns: list[PromptMessage],
    chain: Continued,
) -> Keep:
    """How the reply stores its response once done: its turns are the input's and the reply's."""
    given = _encode(body.input if isinstance(body.input, list) else items.input_items(body.input))

    async def keep(response: dict, output: list[PromptMessage]) -> bool:
        own = items.encode_turns(turns + output)
        stored = StoredResponse(
            id=shape["id"],
            model=shape["model"],
            previous=body.previous_response_id,
            depth=chain.depth + 1,
            chain_bytes=chain.bytes + len(own),
            body=_encode(response),
            turns=own,
            input=given,
            created=shape["created_at"],
        )
        try:
            return await store.put(user, stored)
        except ResponseStoreError as e:
            log.error("%s (%s): not stored: %s", shape["id"], user, e)
            return False

    return keep
