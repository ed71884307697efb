"""A reply read as a whole: reasoning, then content and tool calls, either part off."""

from __future__ import annotations

import pytest

from localserve.chat.reply import ReasoningText, ReplyReader, preserved_tokens
from localserve.chat.tool_calls import ContentDelta, ToolCallArguments, ToolCallStart

REPLY = '<think>\nCall it.\n</think>\n\nOn it.<tool_call>{"name": "f", "arguments": {}}</tool_call>'


def read_all(reader: ReplyReader, pieces):
    events = [e for p in pieces for e in reader.feed(p)]
    finished = reader.finish()
    return events + finished.events, finished.calls


def merged(events):
    """Adjacent events of one kind of text joined: the same whatever the deltas were."""
    out = []
    for e in events:
        if out and type(e) is type(out[-1]) and isinstance(e, ReasoningText | ContentDelta):
            out[-1] = type(e)(out[-1].text + e.text)
        else:
            out.append(e)
    return out


@pytest.mark.parametrize("pieces", [[REPLY], list(REPLY)])
def test_reasoning_then_content_then_a_call_in_order(pieces):
    reader = ReplyReader(reasoning_format="think", tool_format="hermes", new_id=lambda: "id")
    events, calls = read_all(reader, pieces)
    assert merged(events) == [
        ReasoningText("Call it.\n"),
        ContentDelta("On it."),
        ToolCallStart(0, "id", "f"),
        ToolCallArguments(0, "{}"),
    ]
    assert [(c.name, c.arguments) for c in calls] == [("f", "{}")]


def test_without_a_tool_format_the_answer_is_all_content():
    events, calls = read_all(ReplyReader(reasoning_format="think"), list(REPLY))
    assert merged(events)[1] == ContentDelta(REPLY.split("\n\n", 1)[1]) and calls == []


def test_without_a_reasoning_format_the_tags_are_content():
    events, calls = read_all(ReplyReader(tool_format="hermes"), [REPLY])
    assert merged(events)[0] == ContentDelta("<think>\nCall it.\n</think>\n\nOn it.")
    assert len(calls) == 1


def test_the_prompt_may_open_the_reasoning():
    reader = ReplyReader(reasoning_format="think", prompt="<｜Assistant｜><think>\n")
    events, _ = read_all(reader, ["Hmm.</think>", "Yes."])
    assert merged(events) == [ReasoningText("Hmm."), ContentDelta("Yes.")]


def test_the_tokens_the_runner_must_render():
    assert preserved_tokens("magistral", "mistral") == (
        "[THINK]",
        "[/THINK]",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
    )
    assert preserved_tokens(None, "llama3") == ("<|python_tag|>",)
    assert preserved_tokens(None, "gemma") == () == preserved_tokens(None, None)
    assert ReplyReader(reasoning_format="think").preserved_tokens == ("<think>", "</think>")
