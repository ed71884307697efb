"""One model's front door: the `Frontdoor` (door.py) every front-end is given, for every model.

What is the model's (its name, formats, context, prompt builder, warm-up) is its pool slot's;
everything else is the server's admission (admission.py), shared by every door; a chat
submitted here goes to that model. The server hands its front-ends the default model's door,
and `model(name)` gives another's: the same class, so there is one door to read and to fake.

Tested in tests/unit/serve/test_admission.py (chats go in through a door there) and through
the server in tests/e2e/test_several_models.py and the API tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from localserve.chat.constraints import ConstraintCompiler
from localserve.chat.formats import ModelFormats
from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.serve.admission import Admission
from localserve.serve.door import (
    AuthRefusal,
    Embedding,
    Frontdoor,
    ModelDescription,
    ModelOption,
    PullProgress,
    Request,
    Submission,
)
from localserve.serve.pool import ModelSlot
from localserve.serve.prompt import PromptBuilder
from localserve.serve.pulling import pull
from localserve.serve.trusted_proxies import People


class ModelDoor:
    """Admission as the front door of the model of `slot` (a `Frontdoor`)."""

    def __init__(self, admission: Admission, slot: ModelSlot) -> None:
        self._admission = admission
        self._slot = slot

    # --- the server's, the same at every door ---

    @property
    def config(self) -> ServerConfig:
        return self._admission.config

    @property
    def access(self) -> Access:
        return self._admission.access

    @property
    def people(self) -> People:
        return self._admission.people

    @property
    def constraints(self) -> ConstraintCompiler:
        return self._admission.constraints

    @property
    def model_names(self) -> list[str]:
        return self._admission.model_names

    def model(self, name: str | None) -> Frontdoor:
        return ModelDoor(self._admission, self._admission.pool.slot(name))

    def describe_models(self) -> list[ModelDescription]:
        return self._admission.describe_models()

    async def model_choices(self) -> list[ModelOption]:
        return await self._admission.model_choices()

    @property
    def is_shutting_down(self) -> bool:
        return self._admission.is_shutting_down

    @property
    def records_usage(self) -> bool:
        return self._admission.records_usage

    @property
    def num_waiting(self) -> int:
        return self._admission.counts.waiting

    async def authenticate(
        self, address: str, claim: str, token: str | None, allowed: bool, refusal: str
    ) -> AuthRefusal | None:
        authentication = self._admission.authentication
        return await authentication.authenticate(address, claim, token, allowed, refusal)

    def next_number(self) -> int:
        return self._admission.next_number()

    def is_in_flight(self, engine_id: str) -> bool:
        return engine_id in self._admission.counts.requests

    def cancel(self, request: Request) -> None:
        self._admission.cancel(request)

    # --- this model's ---

    @property
    def model_name(self) -> str:
        return self._slot.name

    @property
    def formats(self) -> ModelFormats:
        return self._slot.formats

    @property
    def max_model_len(self) -> int:
        return self._slot.n_ctx

    async def loaded_prompts(self) -> PromptBuilder:
        return await self._admission.waits.loaded_prompts(self._slot)

    def pull(self, spec: str, name: str | None) -> AsyncIterator[PullProgress]:
        return pull(self._admission.pool, spec, name)

    async def warm(self, keep_alive_s: float | None) -> None:
        await self._admission.waits.warm(self._slot, keep_alive_s)

    async def submit(self, submission: Submission) -> Request | None:
        return await self._admission.submit(submission, self._slot)

    async def embed(self, embedding: Embedding) -> Request | None:
        return await self._admission.embed(embedding, self._slot)
