"""What a chat is on its way in (localserve/serve/admission.py): a refusal carries the protocol's
error code, its message and how long to wait; the server's limits that raise it are tested
through the server in e2e/test_websocket_connection.py."""

from __future__ import annotations

import pytest

from localserve.serve.admission import Refusal, Request


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
