"""`POST /v1/completions`: a text prompt in, its continuation out (no chat template).

The prompt is a string, or a list holding one; log probabilities, echo, suffix (insertion) and
best_of above 1 are refused with a 400 that names the field.

Tested in tests/e2e/test_openai_api.py; on a fake Frontdoor in tests/unit/serve/openai/.
"""

from __future__ import annotations

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from localserve.serve.door import Frontdoor
from localserve.serve.openai.errors import ApiError, unsupported
from localserve.serve.openai.reply import start_reply
from localserve.serve.openai.types import CompletionRequest
from localserve.serve.openai.validation import read_body, refuse_unsupported


async def create_completion(door: Frontdoor, request: HttpRequest) -> Response:
    body = await read_body(door, request, CompletionRequest)
    door = door.model(body.model)  # checked by read_body: one of the server's
    _refuse_unsupported(body)
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(
                400, "prompt: a string, or a list holding one string", "invalid_value", "prompt"
            )
        prompt = prompt[0]
    return await start_reply(
        door, request, body, "text", body.max_tokens, lambda prompts, _: prompts.text(prompt)
    )


def _refuse_unsupported(body: CompletionRequest) -> None:
    refuse_unsupported(body)
    if body.logprobs:
        raise unsupported("logprobs", "log probabilities")
    if body.echo:
        raise unsupported("echo", "echoing the prompt")
    if body.suffix:
        raise unsupported("suffix", "a suffix (insertion)")
    if body.best_of not in (None, 1):
        raise unsupported("best_of", "best_of above 1")
