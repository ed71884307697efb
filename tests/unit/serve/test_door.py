"""What crosses the seam (localserve/serve/door.py): a refusal carries the protocol's error
code, its message and how long to wait; a request is compared by identity; a submission is one
frozen value."""

from __future__ import annotations

import dataclasses

import pytest

from localserve.protocol.frames import SamplingFields
from localserve.serve.door import Refusal, Request, Submission


def test_a_refusal_carries_its_code_message_and_retry_after():
    with pytest.raises(Refusal) as e:
        raise Refusal("busy", "8 requests of yours are already in flight", retry_after_s=1)
    assert (e.value.code, e.value.message, e.value.retry_after_s) == (
        "busy",
        "8 requests of yours are already in flight",
        1,
    )
    assert str(e.value) == e.value.message
    assert Refusal("too_long", "x").retry_after_s == 0


def test_a_request_waits_until_admitted_and_is_compared_by_identity():
    a = Request("1:r", "r", "ann", sink=None)
    b = Request("1:r", "r", "ann", sink=None)
    assert a.is_waiting and a != b and a == a


def test_a_submission_is_one_frozen_value_with_what_a_chat_leaves_unsaid_unset():
    async def prompt(prompts, reply_tokens):
        raise AssertionError("not built here")

    chat = Submission(None, "ann", "r", "1:r", SamplingFields(), prompt)
    assert (chat.response_format, chat.constraint, chat.keep_alive_s, chat.cancelled) == (
        None,
        None,
        None,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        chat.user = "bob"
