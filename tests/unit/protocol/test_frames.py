"""The websocket frames (localserve/protocol/frames.py): client frames decode into a closed
union, unknown fields and out-of-range values are refused, server frames encode with their type
tag."""

from __future__ import annotations

import msgspec
import pytest

from localserve.protocol.frames import (
    MAX_STATS_INTERVAL_MS,
    Cancel,
    Chat,
    ClientFrame,
    Error,
    Hello,
    Message,
    SaveConversation,
    StoredMessage,
    Subscribe,
    TokenDelta,
)

decode = msgspec.json.Decoder(ClientFrame).decode


def test_each_client_frame_decodes_by_its_type():
    assert decode(b'{"type": "hello", "user": "ann"}') == Hello("ann")
    assert decode(b'{"type": "cancel", "id": "r"}') == Cancel("r")
    assert decode(b'{"type": "subscribe"}') == Subscribe(interval_ms=500)
    chat = decode(b'{"type": "chat", "id": "r", "messages": [{"role": "user", "content": "hi"}]}')
    assert chat == Chat(id="r", messages=[Message("user", "hi")])
    assert (chat.max_tokens, chat.temperature, chat.stop, chat.ignore_eos) == (256, 0.8, [], False)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type": "teleport"}',
        b'{"user": "ann"}',
        b'{"type": "hello", "user": "ann", "admin": true}',
        b'{"type": "chat", "id": "r", "messages": [], "n": 2}',
        b'{"type": "chat", "id": "r", "messages": [{"role": "user", "content": "x", "by": "a"}]}',
        b'{"type": "chat", "id": 5, "messages": []}',
        b'{"type": "subscribe", "interval_ms": 3600001}',
        b"[]",
    ],
)
def test_unknown_types_fields_and_values_are_refused(frame):
    with pytest.raises(msgspec.ValidationError):
        decode(frame)


def test_the_longest_stats_interval_is_accepted():
    frame = f'{{"type": "subscribe", "interval_ms": {MAX_STATS_INTERVAL_MS}}}'
    assert decode(frame).interval_ms == MAX_STATS_INTERVAL_MS


def test_server_frames_carry_their_type_and_an_error_omits_a_missing_id():
    encode = msgspec.json.encode
    assert msgspec.json.decode(encode(TokenDelta("r", "hi"))) == {
        "type": "token",
        "id": "r",
        "text": "hi",
    }
    assert msgspec.json.decode(encode(Error("busy", "later"))) == {
        "type": "error",
        "code": "busy",
        "message": "later",
    }
    assert msgspec.json.decode(encode(Error("busy", "later", "r")))["id"] == "r"


def test_a_saved_reply_keeps_its_reasoning_and_drops_fields_it_does_not_know():
    frame = decode(
        b'{"type": "save_conversation", "conversation": {"id": "c1", "messages": ['
        b'{"role": "assistant", "content": "4.", "reasoning": "2 + 2", "thinkingSince": 5}]}}'
    )
    assert isinstance(frame, SaveConversation)
    [message] = frame.conversation.messages
    assert message == StoredMessage("assistant", "4.", reasoning="2 + 2")
    assert b"reasoning" not in msgspec.json.encode(StoredMessage("assistant", "4."))
