"""The parsers on replies as the engine streams them: a fake runner whose reply is a script of
token pieces (a model's tokenization, a character's bytes split across tokens), run through
the real engine; the Token events' text read by chat/reply.py's ReplyReader (the reasoning
parser, then the tool-call parser on its answer), as the server reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from localserve.chat.reply import ReasoningText, ReplyReader
from localserve.chat.tool_calls import ContentDelta, ToolCallStart
from localserve.engine.batch import Sampled
from localserve.engine.engine import Engine
from localserve.engine.events import Done, Token
from localserve.engine.sampling_params import SamplingParams
from localserve.runners.fake import EOG, FakeRunner


@dataclass
class ScriptedPiecesRunner(FakeRunner):
    """The fake runner, but every reply is `pieces`, one a token, then end of generation."""

    pieces: list[bytes] = field(default_factory=list)

    def _sample(self, item):
        n = len(item.seq.tokens) - item.seq.num_prompt_tokens
        if n >= len(self.pieces):
            return Sampled(item.seq, EOG, b"", True)
        return Sampled(item.seq, 100 + n, self.pieces[n], False)


def stream(pieces: list[bytes], max_tokens: int = 200) -> tuple[list[str], Done]:
    """The text of each Token event the engine sends for a reply scripted as `pieces`."""
    runner = ScriptedPiecesRunner(pieces=pieces)
    events = []
    engine = Engine(runner, on_events=events.extend, clock=runner.clock)
    engine.add_request("r", [2, 50, 60], SamplingParams(temperature=0, max_tokens=max_tokens))
    while not any(isinstance(e, Done) for e in events):
        engine.step()
    return [e.text for e in events if isinstance(e, Token)], events[-1]


def read(texts, reasoning_format, tool_format, prompt=""):
    """(reasoning, content, calls as (name, arguments), how many events named a call) of a
    streamed reply, read as the server reads it."""
    reader = ReplyReader(reasoning_format=reasoning_format, tool_format=tool_format, prompt=prompt)
    events = [e for text in texts for e in reader.feed(text)]
    finished = reader.finish()
    events += finished.events
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [(c.name, json.loads(c.arguments)) for c in finished.calls]
    return reasoning, content, calls, sum(isinstance(e, ToolCallStart) for e in events)


def tokens(*pieces: str) -> list[bytes]:
    return [p.encode() for p in pieces]


QWEN3 = tokens(
    "<think>", "\n", "The", " user", " wants", " the", " weather", " in", " Z", "ü", "rich", ".",
    "\n", "</think>", "\n\n", "<tool_call>", "\n", '{"', "name", '":', ' "', "get", "_weather",
    '",', ' "', "arguments", '":', ' {"', "city", '":', ' "', "Z", "ü", "rich", '"}}', "\n",
    "</tool_call>", "\n", "<tool_call>", "\n", '{"name": "get_time", "arguments": {}}', "\n",
    "</tool_call>",
)  # fmt: skip


def test_a_qwen3_reply_thinks_then_calls_two_tools():
    texts, done = stream(QWEN3)
    assert done.finish_reason == "stop" and "".join(texts) == b"".join(QWEN3).decode()
    assert len([t for t in texts if t]) == len(QWEN3)  # a piece a token
    reasoning, content, calls, starts = read(texts, "think", "hermes")
    assert reasoning == "The user wants the weather in Zürich.\n"
    assert content == ""
    assert calls == [("get_weather", {"city": "Zürich"}), ("get_time", {})]
    assert starts == 2


def test_a_deepseek_r1_distill_reply_starts_inside_the_reasoning():
    # the distill's template ends the prompt with "<think>\n": no open tag in the reply
    prompt = "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris?<｜Assistant｜><think>\n"
    pieces = tokens("Okay", ",", " I", " need", " the", " tool", ".", "\n", "</", "think", ">")
    pieces += tokens("\n\n", "I'll", " check", ":", "\n", "<｜tool▁calls▁begin｜>")
    pieces += tokens("<｜tool▁call▁begin｜>", "function", "<｜tool▁sep｜>", "get", "_weather", "\n")
    pieces += tokens("```", "json", "\n", '{"city": ', '"Paris"}', "\n", "```")
    pieces += tokens("<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
    reasoning, content, calls, _ = read(stream(pieces)[0], "think", "deepseek", prompt)
    assert reasoning == "Okay, I need the tool.\n"
    assert content == "I'll check:\n"
    assert calls == [("get_weather", {"city": "Paris"})]


def test_a_magistral_reply_thinks_then_calls_in_the_name_args_form():
    pieces = tokens("[THINK]", "Need", " weather", " 🌦", "[/THINK]", "[TOOL_CALLS]", "get")
    pieces += tokens("_weather", "[ARGS]", '{"city"', ': "Paris"}', "[TOOL_CALLS]", "get_time")
    pieces += tokens("[ARGS]", "{}")
    reasoning, content, calls, _ = read(stream(pieces)[0], "magistral", "mistral")
    assert reasoning == "Need weather 🌦"
    assert content == ""
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_a_character_split_across_tokens_reaches_the_parsers_whole():
    cloud = "🌧".encode()
    pieces = [b"<think>", b"rain ", cloud[:2], cloud[2:], b"</think>", b"```tool_code\n"]
    pieces += [b"get_weather(city='K", "ö".encode()[:1], "ö".encode()[1:], b"ln')\n```"]
    texts, _ = stream(pieces)
    assert "" in texts  # the engine held the first half of a character back
    reasoning, content, calls, _ = read(texts, "think", "gemma")
    assert reasoning == "rain 🌧"
    assert calls == [("get_weather", {"city": "Köln"})] and content == ""


@pytest.mark.parametrize("max_tokens", [5, 9, 11])
def test_a_reply_cut_off_by_max_tokens_is_text_not_a_call(max_tokens):
    texts, done = stream(CUT_SHORT, max_tokens=max_tokens)
    assert done.finish_reason == "length"
    reasoning, content, calls, starts = read(texts, "think", "hermes")
    assert reasoning == "ok" and calls == [] and starts == 0
    assert content == "".join(texts).split("</think>", 1)[1]


@pytest.mark.parametrize("max_tokens", [12, 13])
def test_a_call_whose_json_is_whole_is_a_call_even_without_its_closing_tag(max_tokens):
    texts, done = stream(CUT_SHORT, max_tokens=max_tokens)
    assert done.finish_reason == "length"
    _, content, calls, _ = read(texts, "think", "hermes")
    assert content == "Sure." and calls == [("get_weather", {"city": "Paris"})]


CUT_SHORT = tokens(
    "<think>", "ok", "</think>", "Sure", ".", "<tool_call>", "\n", '{"name": ', '"get_weather", ',
    '"arguments": ', '{"city": ', '"Paris"}}', "\n", "</tool_call>",
)  # fmt: skip


def test_a_llama3_reply_with_parallel_calls_and_no_reasoning():
    pieces = tokens("<|python_tag|>", '{"name": "a", ', '"parameters": {"x": 1}}', "; ")
    pieces += tokens('{"name": "b", "parameters": {"y": "ü"}}')
    reasoning, content, calls, _ = read(stream(pieces)[0], "think", "llama3")
    assert reasoning == content == ""
    assert calls == [("a", {"x": 1}), ("b", {"y": "ü"})]
