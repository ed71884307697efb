"""The rule a chat's calls and answers keep (localserve/chat/messages.py's check_tool_history),
as OpenAI's and Anthropic's APIs hold it."""

from __future__ import annotations

import pytest

from localserve.chat.messages import (
    PromptMessage,
    ToolCallMade,
    ToolHistoryError,
    check_tool_history,
)

ASK = PromptMessage("user", "What is the weather in Paris and in Rome?")
WEATHER = '{"city": "Paris"}'


def calls(*ids: str, arguments: str = WEATHER) -> PromptMessage:
    made = tuple(ToolCallMade(i, "get_weather", arguments) for i in ids)
    return PromptMessage("assistant", "", made)


def answer(call_id: str | None) -> PromptMessage:
    return PromptMessage("tool", "21 degrees", (), call_id, "get_weather")


def refusal(*messages: PromptMessage) -> ToolHistoryError:
    with pytest.raises(ToolHistoryError) as refused:
        check_tool_history(messages)
    return refused.value


def test_calls_answered_right_after_them_in_any_order_are_a_history():
    check_tool_history([ASK, calls("a", "b"), answer("b"), answer("a"), ASK])
    check_tool_history([ASK, calls("a"), answer("a"), calls("b"), answer("b")])
    check_tool_history([ASK, calls("a", "b"), answer("a"), ASK])  # one left unanswered: allowed
    check_tool_history([ASK, calls("a", arguments="{}")])


def test_a_tool_message_with_no_call_before_it_is_refused():
    e = refusal(ASK, answer("a"))
    assert (e.index, e.call, e.field) == (1, None, "tool_call_id")
    assert str(e) == "messages[1].tool_call_id: no call comes before it to answer"


def test_a_tool_message_answering_an_unknown_call_is_refused():
    e = refusal(ASK, calls("a"), answer("b"))
    assert e.path == "messages[2].tool_call_id" and "'b' is not a call" in e.why


def test_a_call_is_answered_only_right_after_the_message_that_made_it():
    e = refusal(ASK, calls("a"), answer("a"), calls("b"), answer("a"))  # a: the earlier one's
    assert e.index == 4 and "'a' is not a call of the assistant message right before" in e.why
    e = refusal(ASK, calls("a"), ASK, answer("a"))  # a user turn between
    assert e.index == 3 and "only right after" in e.why
    e = refusal(ASK, calls("a"), PromptMessage("assistant", "Let me see."), answer("a"))
    assert e.index == 3


def test_a_call_is_answered_once():
    e = refusal(ASK, calls("a", "b"), answer("a"), answer("a"))
    assert e.index == 3 and e.why == "'a' is answered twice"


def test_call_ids_are_unique_in_the_chat():
    e = refusal(ASK, calls("a", "a"))
    assert (e.index, e.call, e.field) == (1, 1, "id")
    e = refusal(ASK, calls("a"), answer("a"), calls("b", "a"))
    assert e.path == "messages[3].tool_calls[1].id" and "earlier call's id" in e.why


@pytest.mark.parametrize(
    "arguments",
    ["", "city=Paris", '{"city": ', "[1, 2]", '"Paris"', "null",
     pytest.param("[" * 100_000, id="nested-too-deep")],
)  # fmt: skip
def test_arguments_are_json_text_of_an_object(arguments):
    e = refusal(ASK, calls("a", arguments=arguments))
    assert e.path == "messages[1].tool_calls[0].arguments"
    assert e.why == "not JSON text of an object"
