"""The OpenAI-compatible HTTP API: `/v1/models`, `/v1/chat/completions`, `/v1/completions`.

Every request passes the same admission as a websocket chat (`Server.submit`): the same users,
limits, prefix isolation and too-long check. The API key (`Authorization: Bearer`) names the
user on a server with tokens; on an open server the `user` field does (DEFAULT_USER when
absent). Fields that would change the output and are not supported are refused with a 400 that
names them; unknown harmless fields are ignored (OpenAI clients send many). Errors have
OpenAI's shape, `{"error": {"message", "type", "code", "param"}}`, so clients raise the
matching exception.

A reply streams as server-sent events, or comes whole. Either way the client's connection is
watched: a client that goes away, or stops reading its stream, cancels its request at the next
step (also mid-prefill), and its cells are freed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import secrets
import time
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from localserve.engine.events import Done
from localserve.ops.auth import check_user_name
from localserve.protocol.frames import SAMPLING_FIELDS, SamplingFields
from localserve.serve.admission import RETRY_UNAVAILABLE_S, Refusal
from localserve.serve.prompt import ROLES
from localserve.serve.websocket.connection import MAX_ERROR_CHARS, client_address

if TYPE_CHECKING:
    from localserve.serve.admission import Request
    from localserve.serve.server import Server

log = logging.getLogger("localserve.openai")

DEFAULT_USER = "api"  # the user of an open server's HTTP requests that name none
BODY_TIMEOUT_S = 30.0  # a request body must arrive within this long
PREFIX = "/v1"
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="localserve"'}

_encoder = msgspec.json.Encoder()
_MARK = "\x00"  # stands for a chunk's text in its encoded template
_MARK_JSON = _encoder.encode(_MARK)


# --- requests -----------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: Any = None
    tool_call_id: Any = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class _Common(msgspec.Struct, kw_only=True):
    """Fields both endpoints take; None = not given (some clients send explicit nulls)."""

    model: str | None = None  # None: the server's model (as llama-server does)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # localserve's (and llama-server's) extensions
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    ignore_eos: bool | None = None


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


# --- errors -------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error in OpenAI's shape, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        # like websocket error frames, never more than a little of what the client sent
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS] + "…"
        param = param[:MAX_ERROR_CHARS] if param else param
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.kind, self.headers = kind, headers or {}

    def response(self) -> Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return Response(_encoder.encode(body), self.status, self.headers, "application/json")


def unsupported(param: str, what: str) -> ApiError:
    return ApiError(400, f"{param}: {what} is not supported by localserve", "unsupported", param)


# from the admission's codes (docs/protocol.md) to HTTP
_REFUSALS = {
    "bad_request": (400, "invalid_request_error", "invalid_value"),
    "too_long": (400, "invalid_request_error", "context_length_exceeded"),
    "busy": (429, "rate_limit_error", "rate_limit_exceeded"),
    "quota_exceeded": (429, "insufficient_quota", "insufficient_quota"),
    "shutting_down": (503, "server_error", "shutting_down"),
    "unavailable": (503, "server_error", "engine_unavailable"),
}


def exception_handlers() -> dict:
    """Starlette's own errors (unknown path, wrong method) in OpenAI's shape under /v1."""

    async def http_error(request: HttpRequest, exc: HTTPException) -> Response:
        if not request.url.path.startswith(PREFIX):
            return Response(f"{exc.detail}\n", exc.status_code, exc.headers, "text/plain")
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path[:100]}: {exc.detail}"
        return ApiError(exc.status_code, message, code, headers=exc.headers).response()

    async def api_error(request: HttpRequest, exc: ApiError) -> Response:
        return exc.response()

    return {HTTPException: http_error, ApiError: api_error}


# --- endpoints ----------------------------------------------------------------------------------


def routes(server: Server) -> list[Route]:
    api = _Api(server)
    return [
        Route(f"{PREFIX}/models", api.models, methods=["GET"]),
        Route(f"{PREFIX}/models/{{model:path}}", api.model, methods=["GET"]),
        Route(f"{PREFIX}/chat/completions", api.chat_completions, methods=["POST"]),
        Route(f"{PREFIX}/completions", api.completions, methods=["POST"]),
    ]


class _Api:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.created = int(time.time())

    def _model_card(self) -> dict:
        return {
            "id": self.server.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "localserve",
        }

    async def models(self, request: HttpRequest) -> Response:
        self._identify(request, None)
        return _json({"object": "list", "data": [self._model_card()]})

    async def model(self, request: HttpRequest) -> Response:
        self._identify(request, None)
        self._check_model(request.path_params["model"])
        return _json(self._model_card())

    async def chat_completions(self, request: HttpRequest) -> Response:
        body = await self._body(request, ChatCompletionRequest)
        _refuse_unsupported_chat(body)
        messages = [(_role(m, i), _content(m, i)) for i, m in enumerate(body.messages)]
        max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens
        return await self._submit(
            request, body, "chat", max_tokens, lambda: self.server.prompts.chat(messages)
        )

    async def completions(self, request: HttpRequest) -> Response:
        body = await self._body(request, CompletionRequest)
        _refuse_unsupported_completion(body)
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ApiError(
                    400, "prompt: a string, or a list holding one string", "invalid_value", "prompt"
                )
            prompt = prompt[0]
        return await self._submit(
            request, body, "text", body.max_tokens, lambda: self.server.prompts.text(prompt)
        )

    # --- the common path ----------------------------------------------------------------------

    async def _body(self, request: HttpRequest, kind: type[_Common]):
        """The request's JSON, bounded in bytes and time, as `kind`; 400/408/413 otherwise."""
        limit = self.server.config.max_frame_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise ApiError(413, f"request body over {limit} bytes", "request_too_large")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(413, f"request body over {limit} bytes", "request_too_large")
                    chunks.append(chunk)
        except TimeoutError:
            raise ApiError(
                408, f"request body not received within {BODY_TIMEOUT_S:g} s", "timeout"
            ) from None
        except ClientDisconnect:
            raise ApiError(400, "the client left before its body arrived", "gone") from None
        try:
            body = msgspec.json.decode(b"".join(chunks), type=kind)
        except msgspec.ValidationError as e:
            raise ApiError(400, f"invalid request: {e}", "invalid_value", _param(e)) from None
        except (msgspec.DecodeError, RecursionError) as e:
            raise ApiError(400, f"invalid JSON body: {e}", "invalid_json") from None
        self._check_model(body.model)
        return body

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.server.model_name:
            message = (
                f"the model {model[:100]!r} does not exist here; this server has "
                f"{self.server.model_name!r} (GET /v1/models)"
            )
            raise ApiError(404, message, "model_not_found", "model")

    def _identify(self, request: HttpRequest, named: str | None) -> str:
        """The user: the API key's owner (a server with tokens), else the `user` field."""
        server = self.server
        if server.access.requires_tokens:
            user = server.access.user_for_token(bearer_token(request))
            refused = server.authenticate(
                client_address(request.scope), "api key", user is not None, "invalid API key"
            )
            if refused is not None and refused.retry_after_s:
                wait = _retry_after(refused.retry_after_s)
                raise ApiError(
                    429, refused.message, "rate_limit_exceeded", None, "rate_limit_error", wait
                )
            if refused is not None:
                message = (
                    "invalid API key: give a user's token as the API key "
                    "(Authorization: Bearer <token>)"
                )
                raise ApiError(401, message, "invalid_api_key", headers=_CHALLENGE)
            return user
        name = DEFAULT_USER if named is None else named
        if not check_user_name(name):
            raise ApiError(
                400, "user: 1-64 printable characters, no outer spaces", "invalid_value", "user"
            )
        return name

    async def _submit(self, request, body: _Common, kind: str, max_tokens, prompt) -> Response:
        server = self.server
        user = self._identify(request, body.user)
        fields = _sampling(body, max_tokens, server.config.max_tokens)
        num = next(server.numbers)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        client_id = f"{prefix}-{num}{secrets.token_hex(4)}"
        reply = _Reply(server, request.scope, body, kind, client_id, user)
        try:
            request_ = await server.submit(
                reply, user, client_id, f"{num}:{client_id}", fields, prompt
            )
        except Refusal as e:
            status, error_type, code = _REFUSALS.get(e.code, (500, "server_error", e.code))
            headers = _retry_after(e.retry_after_s) if status in (429, 503) else None
            param = ("messages" if kind == "chat" else "prompt") if e.code == "too_long" else None
            if e.code == "bad_request":
                param = _param_of(e.message)
            raise ApiError(status, e.message, code, param, error_type, headers) from None
        if request_ is None:  # the client left while its prompt was built
            return Response(status_code=499)
        reply.request = request_
        return reply


def _retry_after(seconds: float) -> dict[str, str]:
    """The header every 429 and 503 carries (at least 1 s: some clients read 0 as at once)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def _sampling(body: _Common, max_tokens: int | None, server_max: int) -> SamplingFields:
    """The one sampling definition from an OpenAI body: fields not given keep the defaults."""
    given = {name: getattr(body, name, None) for name in SAMPLING_FIELDS}
    given["max_tokens"] = server_max if max_tokens is None else max_tokens
    if isinstance(body.stop, str):
        given["stop"] = [body.stop]
    return SamplingFields(**{k: v for k, v in given.items() if v is not None})


def _refuse_unsupported_common(body: _Common) -> None:
    if body.n not in (None, 1):
        raise unsupported("n", "more than one choice")
    if body.logit_bias:
        raise unsupported("logit_bias", "a logit bias")


def _refuse_unsupported_chat(body: ChatCompletionRequest) -> None:
    _refuse_unsupported_common(body)
    if body.logprobs or body.top_logprobs:
        raise unsupported("logprobs" if body.logprobs else "top_logprobs", "log probabilities")
    for param in ("tools", "functions"):
        if getattr(body, param):
            raise unsupported(param, "tool calling")
    for param in ("tool_choice", "function_call"):
        if getattr(body, param) not in (None, "none"):
            raise unsupported(param, "tool calling")
    fmt = body.response_format
    if fmt is not None and fmt.get("type", "text") != "text":
        raise unsupported("response_format", f"response_format {str(fmt.get('type'))[:40]!r}")
    if body.audio is not None or (body.modalities not in (None, ["text"])):
        raise unsupported("modalities" if body.audio is None else "audio", "audio output")
    if body.prediction is not None:
        raise unsupported("prediction", "predicted output")


def _refuse_unsupported_completion(body: CompletionRequest) -> None:
    _refuse_unsupported_common(body)
    if body.logprobs:
        raise unsupported("logprobs", "log probabilities")
    if body.echo:
        raise unsupported("echo", "echoing the prompt")
    if body.suffix:
        raise unsupported("suffix", "a suffix (insertion)")
    if body.best_of not in (None, 1):
        raise unsupported("best_of", "best_of above 1")


def _role(message: ChatMessage, i: int) -> str:
    if message.tool_calls or message.tool_call_id is not None or message.role == "tool":
        raise unsupported(f"messages[{i}]", "a tool message")
    role = "system" if message.role == "developer" else message.role
    if role not in ROLES:
        raise ApiError(
            400,
            f"messages[{i}].role: {message.role[:40]!r} is not one of "
            f"{', '.join(ROLES)} (or developer)",
            "invalid_value",
            f"messages[{i}].role",
        )
    return role


def _content(message: ChatMessage, i: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise unsupported(f"messages[{i}].content[{j}]", f"content of type {part.type[:40]!r}")
        texts.append(part.text)
    return "".join(texts)


def _param(error: msgspec.ValidationError) -> str | None:
    """The field a msgspec error names (`... - at `$.messages[0].role``)."""
    text = str(error)
    _, sep, path = text.rpartition("at `$.")
    return path.rstrip("`") if sep else None


def _param_of(message: str) -> str | None:
    """The field an admission message starts with (`temperature: must be ...`)."""
    head, sep, _ = message.partition(":")
    return head if sep and head.replace("_", "").isalnum() else None


def bearer_token(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _json(body) -> Response:
    return Response(_encoder.encode(body), media_type="application/json")


# --- replies ------------------------------------------------------------------------------------


class _Reply:
    """One request's reply: the sink of its engine events and the ASGI response that sends it.

    Streaming, text is written as it comes; text that arrives while a write is blocked is
    coalesced into the next event, and a client that lets max_outbox_bytes pile up, or takes
    nothing for write_timeout_s, is cut off and its request cancelled.
    """

    api = "http"  # in the usage record

    def __init__(
        self, server: Server, scope, body: _Common, kind: str, client_id: str, user: str
    ) -> None:
        self.server = server
        self.scope = scope
        self.kind = kind  # "chat" or "text"
        self.client_id = client_id
        self.user = user
        self.model = server.model_name
        self.stream = bool(body.stream)
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)
        self.created = int(time.time())
        self.request: Request | None = None
        self.is_closed = False
        self.pending: list[str] = []
        self.num_pending_bytes = 0
        self.done: Done | None = None
        self._ready = asyncio.Event()

    # the sink: called by the server with the engine's events

    def on_token(self, request: Request, text: str) -> None:
        self.pending.append(text)
        self.num_pending_bytes += len(_encoder.encode(text))  # as it will be sent
        if self.stream and self.num_pending_bytes > self.server.config.max_outbox_bytes:
            self._give_up(f"not reading: over {self.server.config.max_outbox_bytes} bytes unsent")
        self._ready.set()

    def on_queued(self, request: Request, position: int) -> None:
        pass

    def on_done(self, request: Request, done: Done) -> None:
        self.done = done
        self._ready.set()

    def _give_up(self, why: str) -> None:
        """The client is gone or not reading: cancel the request, cut the connection."""
        if self.is_closed:
            return
        self.is_closed = True
        log.warning("%s (%s): %s; request cancelled", self.client_id, self.user, why)
        if self.request is not None and self.done is None:
            self.server.cancel(self.request)
        transport = self.scope.get("extensions", {}).get("localserve")
        if transport is not None and why.startswith("not reading"):
            transport.abort()
        self._ready.set()

    # the ASGI response

    async def __call__(self, scope, receive, send) -> None:
        send = functools.partial(self._send_within_timeout, send)
        watcher = asyncio.create_task(self._watch(receive))
        try:
            if self.stream:
                await self._send_stream(send)
            else:
                await self._send_whole(send)
        finally:
            watcher.cancel()
            if self.done is None:  # gone, or this failed: nobody will read the rest
                self._give_up("the reply was not delivered")

    async def _watch(self, receive) -> None:
        """The client closing its connection (or stream) cancels the request."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return self._give_up("the client closed the connection")

    async def _next(self) -> tuple[str, Done | None]:
        await self._ready.wait()
        self._ready.clear()
        text, self.pending, self.num_pending_bytes = "".join(self.pending), [], 0
        return text, self.done

    async def _send_whole(self, send) -> None:
        parts = []
        while not self.is_closed:
            text, done = await self._next()
            parts.append(text)
            if done is not None:
                break
        if self.is_closed or done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = self._failure(done)
            return await error.response()(self.scope, _no_receive, send)
        text = "".join(parts)
        if self.kind == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": done.finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": done.finish_reason,
            }
        body = self._envelope([choice], whole=True)
        body["usage"] = _usage(done)
        await _json(self._unrecorded(body))(self.scope, _no_receive, send)

    async def _send_stream(self, send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if self.kind == "chat":
            await self._write(send, self._chunk({"role": "assistant", "content": ""}))
        # every text chunk is the same JSON but for its text: encode that once
        head, tail = _encoder.encode(
            self._chunk({"content": _MARK} if self.kind == "chat" else _MARK)
        ).split(_MARK_JSON)
        head, tail = b"data: " + head, tail + b"\n\n"
        done = None
        while done is None and not self.is_closed:
            text, done = await self._next()
            if text:
                await self._write_bytes(send, head + _encoder.encode(text) + tail)
        if self.is_closed or done is None:
            return
        if done.finish_reason in ("error", "cancelled"):
            error = self._failure(done)
            payload = {
                "error": {
                    "message": error.message,
                    "type": error.kind,
                    "code": error.code,
                    "param": None,
                }
            }
            await self._write(send, payload)
        else:
            empty = {} if self.kind == "chat" else ""
            last = self._chunk(empty, done.finish_reason)
            if self.include_usage:
                await self._write(send, last)
                last = self._envelope([], whole=False)
                last["usage"] = _usage(done)
            await self._write(send, self._unrecorded(last))
        await self._write(send, None)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, send, event) -> None:
        data = b"data: [DONE]\n\n" if event is None else b"data: %s\n\n" % _encoder.encode(event)
        await self._write_bytes(send, data)

    async def _write_bytes(self, send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _send_within_timeout(self, send, message) -> None:
        """Every write: a client whose socket takes nothing for write_timeout_s is cut off."""
        if self.is_closed:
            return
        timeout = self.server.config.write_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await send(message)
        except TimeoutError:
            self._give_up(f"not reading for {timeout:g} s")

    def _unrecorded(self, body: dict) -> dict:
        """The reply's last object says `"recorded": false` when its usage row was not
        committed (a server without a usage record promises nothing: no key)."""
        request = self.request
        if self.server.usage is not None and request is not None and not request.is_recorded:
            body["recorded"] = False
        return body

    def _chunk(self, delta, finish_reason: str | None = None) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = self._envelope([choice], whole=False)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _envelope(self, choices: list, whole: bool) -> dict:
        obj = (
            ("chat.completion" if whole else "chat.completion.chunk")
            if self.kind == "chat"
            else "text_completion"
        )
        return {
            "id": self.client_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def _failure(self, done: Done) -> ApiError:
        if done.finish_reason == "cancelled":
            if self.server.is_shutting_down:
                message = "the server shut down before the reply was done"
                return ApiError(
                    503, message, "shutting_down", None, "server_error", _retry_after(0)
                )
            return ApiError(500, "the request was cancelled", "cancelled", kind="server_error")
        if done.error_code == "unavailable":  # the engine process stopped under it
            wait = _retry_after(RETRY_UNAVAILABLE_S)
            return ApiError(503, done.error[:300], "engine_unavailable", None, "server_error", wait)
        return ApiError(
            500,
            f"the engine failed this request: {done.error or 'error'}"[:300],
            "internal_error",
            kind="server_error",
        )


def _usage(done: Done) -> dict:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


async def _no_receive():
    return {"type": "http.disconnect"}
