"""Long chats on the real model (`[server] context_overflow`): a conversation longer than the
context drops its oldest turns, over the OpenAI API (the `openai` package) and the websocket
protocol alike, says how many, keeps sharing a cached prefix from one turn to the next, and is
refused as before with context_overflow = "refuse".

The server here is the `live` one's configuration with n_ctx 1024 instead of 4096 (a module of
its own): a chat longer than the context then costs a quarter of the prefill, which on two shared
cores is the difference between seconds and a minute a request. A chat of 5,000 one-word
messages goes to a second one (`wide`) with the default model's context, 8,192 tokens, and the
default frames (256 KiB) that such a chat needs."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request

import msgspec
import openai
import pytest

from localserve.serve.prompt import render_chat
from tests.support.live import LiveServer, configured, live_config

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m"
N_CTX = 1024
WIDE_CTX = 4096
SYSTEM = "You are a patient librarian who answers in one short sentence."


@pytest.fixture(scope="module")
def live():
    """The live fixture's server (tests/e2e/conftest.py) with a context of N_CTX tokens; the
    conftest's `connect` connects to this one."""
    from localserve.serve.serving import serving

    with serving(live_config(N_CTX), thread=True) as served:
        yield LiveServer(served)


@pytest.fixture(scope="module")
def wide():
    """The same server with a context of WIDE_CTX tokens and frames of 256 KiB."""
    from localserve.serve.serving import serving

    config = live_config(WIDE_CTX)
    server = msgspec.structs.replace(config.server, max_frame_bytes=256 << 10)
    with serving(msgspec.structs.replace(config, server=server), thread=True) as served:
        yield LiveServer(served)


def client(live, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.http + "/v1", api_key="none", max_retries=0, timeout=timeout)


def conversation(num_turns: int) -> list[dict]:
    """A system prompt, num_turns questions with their answers (about 35 tokens a turn), and the
    newest question."""
    messages = [{"role": "system", "content": SYSTEM}]
    for t in range(num_turns):
        topic = f"shelf number {t}"
        question = f"Tell me about {topic}: which books are there, and who reads them?"
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": f"On {topic} there are old atlases."})
    messages.append({"role": "user", "content": "Where is the newest question's answer, then?"})
    return messages


@contextlib.contextmanager
def prompts_sent(live):
    """The prompt tokens the server hands the engine, per request (a hook on its engine client)."""
    engine = live.server.engine
    sent: list[list[int]] = []
    add = engine.add_request

    def spy(request_id, prompt_tokens, *args, **kwargs):
        sent.append(list(prompt_tokens))
        return add(request_id, prompt_tokens, *args, **kwargs)

    engine.add_request = spy
    try:
        yield sent
    finally:
        del engine.add_request  # the class's method again


def expected_tokens(live, messages: list[dict]) -> list[int]:
    """The tokens of this chat's prompt as the server renders it (the embedded model's
    transcript format)."""
    chat = [(m["role"], m["content"]) for m in messages]
    model = live.model
    r = render_chat(chat, model.chat_format, live.runner.apply_chat_template, model.system_prompt)
    return live.runner.tokenize(r.text)


def test_a_40_turn_chat_longer_than_the_context_gets_200s_and_says_what_was_dropped(live):
    messages = conversation(40)
    c = client(live)
    with prompts_sent(live) as sent:
        reply = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0, user="reader"
        )
        stream = c.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            temperature=0,
            user="reader",
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    whole = reply.parse()
    dropped = whole.usage.dropped_messages
    assert reply.status_code == 200 and dropped > 0 and dropped % 2 == 0
    assert reply.headers["x-localserve-dropped-messages"] == str(dropped)
    assert len(expected_tokens(live, messages)) > N_CTX  # it was too long for the context
    # what was sent: the system prompt, then whole turns from a user message, then the newest
    kept = [messages[0], *messages[1 + dropped :]]
    assert kept[1]["role"] == "user" and kept[-1] == messages[-1]
    assert sent[0] == expected_tokens(live, kept)
    assert whole.usage.prompt_tokens == len(sent[0]) and len(sent[0]) + 16 <= N_CTX
    assert whole.choices[0].finish_reason in ("stop", "length")
    # streamed: the same cut, said in the final chunk's usage
    assert chunks[-1].usage.dropped_messages == dropped and sent[1] == sent[0]
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_successive_turns_of_a_long_chat_keep_sharing_a_cached_prefix(live):
    """The cut stays put from one turn to the next (it moves in steps of n_ctx / 4), so each
    turn reuses the previous one's prompt from the engine's prefix cache."""
    c = client(live)
    messages = conversation(30)
    turns = []
    for t in range(6):
        reply = c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, temperature=0, user="regular"
        )
        u = reply.usage
        turns.append((u.dropped_messages, u.prompt_tokens_details.cached_tokens, u.prompt_tokens))
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": f"And what about shelf {100 + t}? " * 2})
    print("dropped, cached, prompt tokens per turn:", turns)
    assert all(dropped > 0 for dropped, _, _ in turns), turns
    same_cut = [
        (cached, before_prompt)
        for (d0, _, before_prompt), (d1, cached, _) in zip(turns, turns[1:], strict=False)
        if d0 == d1
    ]
    # about 40 tokens a turn, a step of 256: the cut moves at most once in these 6 turns (the
    # fewest turns that fit would move it at every turn, and nothing would be cached)
    assert len(same_cut) >= 4, turns
    assert all(cached >= 0.9 * before for cached, before in same_cut), turns


def test_the_websocket_done_frame_says_how_many_messages_were_dropped(live, connect):
    messages = conversation(40)
    ws = connect()
    ws.hello("walter")
    ws.send({"type": "chat", "id": "long", "messages": messages, "max_tokens": 8, "temperature": 0})
    done = ws.until_done("long")[-1]
    assert done["finish_reason"] in ("stop", "length") and done["dropped_messages"] > 0
    assert done["usage"]["prompt_tokens"] + 8 <= N_CTX
    ws.send({"type": "chat", "id": "short", "messages": messages[-3:], "max_tokens": 4})
    assert ws.until_done("short")[-1]["dropped_messages"] == 0


def test_a_chat_of_5000_one_word_messages_keeps_about_as_many_of_the_newest_as_fit(wide):
    """A message of this chat takes 4 tokens in the prompt ("User: hi" and a line break), 1 of
    them its content: the newest 1,000 or so fit 4,096 tokens, and are kept but for the cut's
    step (a quarter of the context) — not its newest turn alone. The next turn reuses the
    prompt from the cache, cut at the same place."""
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": ("user", "assistant")[i % 2], "content": "hi"} for i in range(4998)]
    messages.append({"role": "user", "content": "Where were we?"})
    c = client(wide, timeout=600)  # a prefill of 3,000 tokens or more, at 4,096 of context
    with prompts_sent(wide) as sent:
        start = time.monotonic()
        reply = c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0, user="chatty"
        )
    u, dropped = reply.usage, reply.usage.dropped_messages
    print(f"{u.prompt_tokens} prompt tokens of {WIDE_CTX}, {5000 - dropped} messages kept,")
    print(f"{time.monotonic() - start:.1f} s for the whole request")
    assert dropped > 0 and dropped % 2 == 0
    assert sent[0] == expected_tokens(wide, [messages[0], *messages[1 + dropped :]])
    assert WIDE_CTX - WIDE_CTX // 4 - 8 < u.prompt_tokens + 16 <= WIDE_CTX  # a step and a turn
    assert 5000 - dropped > WIDE_CTX // 6  # ~1,000 of the 5,000 fit: not the newest turn alone
    messages += [reply.choices[0].message.model_dump(include={"role", "content"})]
    messages.append({"role": "user", "content": "And then?"})
    again = c.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, user="chatty"
    )
    assert again.usage.dropped_messages == dropped, again.usage
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * u.prompt_tokens


def test_no_room_for_max_tokens_keeps_the_newest_turn_and_ends_at_the_context(live):
    """System prompt + newest turn fit, but not with max_tokens: every older turn goes and the
    reply may run to the end of the context (finish_reason length there)."""
    messages = [*conversation(4)[:-1], {"role": "user", "content": "Please go on. " * 240}]
    reply = client(live).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1000, temperature=0, user="filler"
    )
    assert reply.usage.dropped_messages == 8
    u = reply.usage
    assert u.prompt_tokens + 1000 > N_CTX and u.total_tokens <= N_CTX
    if reply.choices[0].finish_reason == "length":  # not max_tokens' 1,000: the context's end
        assert u.total_tokens >= N_CTX - 1 and u.completion_tokens < 1000, u


def test_refuse_mode_and_raw_completions_keep_the_error(live, connect):
    messages = conversation(40)
    with configured(live, context_overflow="refuse"):
        with pytest.raises(openai.BadRequestError) as e:
            client(live).chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        assert e.value.code == "context_length_exceeded" and str(N_CTX) in e.value.message
        ws = connect()
        ws.hello("rita")
        ws.send({"type": "chat", "id": "r", "messages": messages, "max_tokens": 8})
        assert ws.recv()["code"] == "too_long"
    prompt = "\n".join(m["content"] for m in messages)
    with pytest.raises(openai.BadRequestError) as e:
        client(live).completions.create(model=MODEL, prompt=prompt, max_tokens=8)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:  # one message too long: nothing to drop
        client(live).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 1500}], max_tokens=8
        )
    assert e.value.code == "context_length_exceeded"


def test_models_give_their_context_length(live):
    models = client(live).models.list()
    assert [m.max_model_len for m in models.data] == [N_CTX]
    with urllib.request.urlopen(f"{live.http}/v1/models/{MODEL}", timeout=30) as r:
        assert json.load(r)["max_model_len"] == N_CTX
