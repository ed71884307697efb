"""Where the load generator sends and what it measures (localserve/bench/targets.py): a request's
timings by vLLM's definitions, the target a URL names and the body an endpoint takes."""

from __future__ import annotations

import dataclasses

import pytest

from localserve.bench.runs import single
from localserve.bench.targets import OpenAITarget, WebSocketTarget, _chat, target
from localserve.bench.workloads import RequestSpec
from tests.support.bench import result


def test_request_timings_follow_vllm_definitions():
    r = result(sent=10.0, gaps=[0.1, 0.2, 0.3], ttft=0.5)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(0.5 + 0.6)
    assert r.tpot == pytest.approx(0.6 / 3)  # (e2e - ttft) / (n - 1)
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])


def test_coalesced_frames_make_tpot_differ_from_itl():
    # 4 tokens arrived in 2 frames: ITL sees one gap, TPOT spreads it over 3 tokens
    r = result(sent=0.0, gaps=[0.3], ttft=0.2, tokens=4)
    assert r.itls == pytest.approx([0.3]) and r.tpot == pytest.approx(0.1)


def test_the_url_names_the_target_and_the_endpoint_shapes_the_body():
    assert isinstance(target("ws://127.0.0.1:8765"), WebSocketTarget)
    chat_peer = target("http://127.0.0.1:8080", openai=True, endpoint="chat")
    assert isinstance(chat_peer, OpenAITarget) and chat_peer.path == "/v1/chat/completions"
    assert target("http://127.0.0.1:8080", openai=True).path == "/v1/completions"
    with pytest.raises(ValueError, match="--endpoint"):
        OpenAITarget("http://127.0.0.1:8080", "embeddings")
    request = single(RequestSpec("short", "Hi?", 4), ignore_eos=False, seed=1)
    body = chat_peer.body(request)
    assert body["messages"] == [{"role": "user", "content": "Hi?"}] and "prompt" not in body
    assert body["temperature"] == 0.7 and body["stream_options"] == {"include_usage": True}
    completion = OpenAITarget("http://x").body(dataclasses.replace(request, reuse=False))
    assert completion["prompt"].endswith("User: Hi?\nAssistant:") and completion["stop"]
    assert completion["cache_prompt"] is False and "messages" not in completion


def test_a_temperature_given_reaches_every_servers_request():
    # `bench --temperature 0` (greedy, for speculative decoding's benchmark): the websocket chat
    # frame, llama-server's /v1/completions body and /v1/chat/completions' all carry it
    spec = RequestSpec("edit", "Repeat this.", 8)
    assert single(spec, ignore_eos=True, seed=1).temperature == 0.7  # the default, unchanged
    greedy = single(spec, ignore_eos=True, seed=1, temperature=0.0)
    assert _chat(greedy, "r").temperature == 0.0
    for endpoint in ("completions", "chat"):
        body = OpenAITarget("http://127.0.0.1:8080", endpoint).body(greedy)
        assert body["temperature"] == 0.0 and body["ignore_eos"] is True


def test_a_schemad_request_reaches_every_server_with_its_schema_and_its_history():
    # the json workload (issue 52): the websocket chat frame and /v1/chat/completions carry
    # OpenAI's response_format, llama-server's /v1/completions its json_schema; the multiturn
    # workload's earlier turns come before the prompt everywhere
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}}
    spec = RequestSpec("json", "Extract.", 8, (("user", "a"), ("assistant", "b")), fmt)
    request = single(spec, ignore_eos=False, seed=1, temperature=0.0)
    assert request.messages == (("user", "a"), ("assistant", "b"), ("user", "Extract."))
    assert _chat(request, "r").response_format == fmt
    assert OpenAITarget("http://x", "chat").body(request)["response_format"] == fmt
    completion = OpenAITarget("http://x").body(request)
    assert completion["json_schema"] == {"type": "object"} and "response_format" not in completion
    assert "User: a\nAssistant: b\nUser: Extract.\nAssistant:" in completion["prompt"]
