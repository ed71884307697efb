"""docs/grafana/localserve.json against a real server (the paced FakeRunner): every query reads
a series that `/metrics` has after finished and cancelled requests, and the vLLM-style series'
values for one known request. The dashboard on its own is unit/ops/test_grafana_dashboard.py."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from localserve.bench.blocking_ws import WS
from tests.support.grafana import HISTOGRAM_SUFFIXES, load, queried_names

QUESTION = "Tell me everything you know about the tides, the moon and the sea. " * 4


def scrape(server) -> str:
    with urllib.request.urlopen(server.http + "/metrics", timeout=10) as response:
        return response.read().decode()


def declared_types(text: str) -> dict[str, str]:
    """`# TYPE name kind` lines: each family as Prometheus stores it (counters with _total)."""
    return {
        parts[2]: parts[3]
        for line in text.splitlines()
        if (parts := line.split()) and parts[:2] == ["#", "TYPE"]
    }


def samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def family_of(name: str, types: dict[str, str]) -> str:
    """A histogram's family for its `_bucket`, `_sum` and `_count` series; else the name."""
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and types.get(base) == "histogram":
            return base
    return name


def value(text: str, name: str, **labels) -> float:
    """The one sample called `name` whose labels include `labels`."""
    (found,) = [
        s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items()
    ]
    return found


@pytest.fixture(scope="module")
def finished(fake):
    """The fake server after replies that ran out of tokens or stopped, and one cancelled."""
    ws = WS(fake.url)
    try:
        welcome = ws.hello("grafana")
        for i, max_tokens in enumerate((3, 8, 64)):
            ws.chat(f"r{i}", QUESTION, max_tokens=max_tokens)
            assert ws.until_done(f"r{i}")[-1]["finish_reason"] in ("stop", "length")
        ws.chat("long", QUESTION, max_tokens=welcome["limits"]["max_tokens"], ignore_eos=True)
        ws.until(lambda f: f["type"] == "token" and f["id"] == "long")
        ws.send({"type": "cancel", "id": "long"})
        assert ws.until_done("long")[-1]["finish_reason"] == "cancelled"
    finally:
        ws.close()
    fake.wait_idle()
    return fake


def test_every_series_the_dashboard_queries_is_in_metrics(finished):
    text = scrape(finished)
    types = declared_types(text)
    exported = {s.name for s in samples(text)}
    for name in sorted(queried_names(load())):
        assert family_of(name, types) in types, f"{name}: no such family in /metrics"
        assert name in exported, f"{name}: no such series in /metrics"
        if name.endswith("_bucket"):  # histogram_quantile and heatmaps need a histogram's buckets
            assert types[family_of(name, types)] == "histogram", name


def test_the_series_it_queries_have_the_model_label_and_data(finished):
    text = scrape(finished)
    types = declared_types(text)
    families = {family_of(n, types) for n in queried_names(load())}
    by_name: dict[str, list] = {}
    for s in samples(text):
        by_name.setdefault(family_of(s.name, types), []).append(s)
    for family in families:
        assert all(s.labels.get("model_name") == "fake" for s in by_name[family]), family
        if types[family] == "histogram":  # every one counts something by now
            assert value(text, family + "_count") > 0, family
    assert value(text, "localserve:request_success_total", finished_reason="abort") >= 1
    assert value(text, "localserve:request_success_total", finished_reason="length") >= 1


def test_one_known_request_in_the_vllm_series(finished):
    """Before and after one request: its lengths, phases, reason and prefix cache tokens."""
    ws = WS(finished.url)
    try:
        assert ws.hello("known")["type"] == "welcome"
        messages = [{"role": "user", "content": QUESTION}]
        ws.chat("turn1", QUESTION, max_tokens=12)
        frames = ws.until_done("turn1")
        reply = "".join(f["text"] for f in frames if f["type"] == "token")
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "And the sun?"},
        ]
        before = scrape(finished)
        ws.send({"type": "chat", "id": "turn2", "messages": messages, "max_tokens": 9})
        done = ws.until_done("turn2")[-1]
    finally:
        ws.close()
    finished.wait_idle()
    after = scrape(finished)

    def delta(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    usage, timings = done["usage"], done["timings"]
    prompt, generated = usage["prompt_tokens"], usage["completion_tokens"]
    assert usage["cached_tokens"] > 0  # the second turn reused the first
    p = "localserve:"
    assert delta(p + "request_success_total", finished_reason=done["finish_reason"]) == 1
    assert delta(p + "prefix_cache_hits_total") == usage["cached_tokens"]
    assert delta(p + "prefix_cache_queries_total") == prompt
    assert delta(p + "request_prompt_tokens_count") == 1
    assert delta(p + "request_prompt_tokens_sum") == prompt
    for s in samples(after):  # one observation, in every bucket from the first that holds it
        if s.name == p + "request_prompt_tokens_bucket":
            expected = 1 if float(s.labels["le"]) >= prompt else 0
            assert delta(s.name, le=s.labels["le"]) == expected, s.labels["le"]
    assert delta(p + "request_generation_tokens_sum") == generated
    assert delta(p + "request_params_max_tokens_sum") == 9
    seconds = {k: v / 1e3 for k, v in timings.items()}
    prefill = seconds["ttft_ms"] - seconds["queue_ms"]  # first admission -> first token
    decode = seconds["e2e_ms"] - seconds["ttft_ms"]  # first -> last token (it ended there)
    assert delta(p + "request_prefill_time_seconds_sum") == pytest.approx(prefill, abs=1e-6)
    assert delta(p + "request_decode_time_seconds_sum") == pytest.approx(decode, abs=1e-6)
    inference = delta(p + "request_inference_time_seconds_sum")
    assert inference == pytest.approx(prefill + decode, abs=1e-6)
