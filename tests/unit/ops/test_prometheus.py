"""`/metrics` text (localserve/ops/prometheus.py): a snapshot rendered in Prometheus's format."""

from __future__ import annotations

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from localserve.ops.prometheus import FINISHED_REASONS, HISTOGRAMS, PREFIX, TIER_METRICS, render
from localserve.protocol.snapshot import PrefixTier


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_snapshot_renders_as_parseable_text_with_no_user_label(fake_snapshots):
    snap = fake_snapshots[-1]
    text = render(snap, auth_failures=3, auth_throttled=1)
    assert text.endswith("\n")
    found = families(text)
    for name in HISTOGRAMS:
        family = found[PREFIX + name]
        assert family.type == "histogram"
        count = next(s for s in family.samples if s.name.endswith("_count"))
        assert count.value == snap.histograms[name].count
    running = found[PREFIX + "num_requests_running"].samples[0]
    assert running.value == snap.running and running.labels == {"model_name": "fake"}
    assert found[PREFIX + "auth_failures"].samples[0].value == 3
    assert found[PREFIX + "auth_throttled"].samples[0].value == 1
    steps = found[PREFIX + "engine_steps"]
    assert steps.type == "counter" and steps.samples[0].value == snap.counters.steps
    labels = {k for f in found.values() for s in f.samples for k in s.labels}
    # never the user: cardinality, privacy
    assert labels == {"model_name", "le", "finished_reason", "tier"}
    with_reason = {
        f.name for f in found.values() for s in f.samples if "finished_reason" in s.labels
    }
    assert with_reason == {PREFIX + "request_success"}


def test_request_success_counts_every_finish_under_vllms_reasons(fake_snapshots):
    snap = fake_snapshots[-1]
    c = snap.counters
    samples = families(render(snap))[PREFIX + "request_success"].samples
    by_reason = {s.labels["finished_reason"]: s.value for s in samples}
    assert list(by_reason) == ["stop", "length", "abort", "error"] == list(FINISHED_REASONS)
    assert by_reason == {
        "stop": c.finished_stop,
        "length": c.finished_length,
        "abort": 0,
        "error": 0,
    }
    assert sum(by_reason.values()) == c.finished > 0
    assert all(s.labels["model_name"] == "fake" for s in samples)


def test_prefix_cache_queries_and_hits_are_tokens(fake_snapshots):
    snap = fake_snapshots[-1]
    found = families(render(snap))

    def value(name: str) -> float:
        return found[PREFIX + name].samples[0].value

    c = snap.counters
    assert c.cached_tokens > 0 and c.prefix_hits == 1  # ana's follow-up reused her first turn
    assert value("prefix_cache_hits") == value("prefix_cache_hit_tokens") == c.cached_tokens
    assert value("prefix_cache_queries") == c.prefix_cache_queries == c.prompt_tokens
    assert value("prefix_cache_hit_requests") == c.prefix_hits


def test_a_snapshot_without_the_newer_histograms_still_renders(fake_snapshots):
    snap = fake_snapshots[-1]
    old = msgspec.structs.replace(
        snap,
        histograms={"time_to_first_token_seconds": snap.histograms["time_to_first_token_seconds"]},
    )
    found = families(render(old))
    assert PREFIX + "time_to_first_token_seconds" in found
    assert PREFIX + "request_prompt_tokens" not in found


def test_kv_usage_leaves_out_cells_only_cached_prefixes_hold(fake_snapshots):
    snap = fake_snapshots[-1]
    usage = families(render(snap))[PREFIX + "kv_cache_usage_perc"].samples[0].value
    assert usage == (snap.kv_used - snap.kv_cached) / snap.kv_total


def test_a_model_name_is_escaped_in_the_label(fake_snapshots):
    snap = fake_snapshots[0]
    odd = msgspec.structs.replace(snap, model=msgspec.structs.replace(snap.model, model='a"b\\c'))
    sample = families(render(odd))[PREFIX + "num_requests_waiting"].samples[0]
    assert sample.labels == {"model_name": 'a"b\\c'}


def test_several_models_get_one_series_each_told_apart_by_model_name(fake_snapshots):
    from localserve.ops.prometheus import ModelState
    from localserve.protocol.snapshot import ModelInfo

    first = fake_snapshots[-1]
    info = msgspec.structs.replace(first.model, model="small")
    assert isinstance(info, ModelInfo)
    second = msgspec.structs.replace(first, model=info)
    states = [ModelState("fake", "loaded", 5 << 20), ModelState("small", "loaded", 0),
              ModelState("big", "failed", 0)]  # fmt: skip
    found = families(render([first, second], 2, 0, states))
    running = found[PREFIX + "num_requests_running"].samples
    assert [s.labels["model_name"] for s in running] == ["fake", "small"]
    assert len(found[PREFIX + "auth_failures"].samples) == 1  # the server's, once
    success = found[PREFIX + "request_success"].samples
    assert {s.labels["model_name"] for s in success} == {"fake", "small"}
    ttft = found[PREFIX + "time_to_first_token_seconds"].samples
    assert {s.labels["model_name"] for s in ttft} == {"fake", "small"}
    loaded = {s.labels["model_name"]: (s.labels["state"], s.value)
              for s in found[PREFIX + "model_loaded"].samples}  # fmt: skip
    assert loaded == {"fake": ("loaded", 1), "small": ("loaded", 1), "big": ("failed", 0)}
    memory = {s.labels["model_name"]: s.value for s in found[PREFIX + "model_memory_bytes"].samples}
    assert memory["fake"] == 5 << 20


def test_speculative_decoding_is_vllms_spec_decode_series_with_acceptance_by_position(
    fake_snapshots,
):
    counters = msgspec.structs.replace(
        fake_snapshots[-1].counters,
        spec_drafts=10,
        spec_draft_tokens=40,
        spec_accepted_tokens=25,
        spec_accepted_per_position=[10, 8, 5, 2],
    )
    found = families(render(msgspec.structs.replace(fake_snapshots[-1], counters=counters)))
    for name, value in (("drafts", 10), ("draft_tokens", 40), ("accepted_tokens", 25)):
        family = found[f"{PREFIX}spec_decode_num_{name}"]
        assert family.type == "counter" and family.samples[0].value == value
    per_pos = found[PREFIX + "spec_decode_num_accepted_tokens_per_pos"]
    assert [(s.labels["position"], s.value) for s in per_pos.samples] == [
        ("0", 10),
        ("1", 8),
        ("2", 5),
        ("3", 2),
    ]
    assert all(s.labels["model_name"] == "fake" for s in per_pos.samples)


def test_embedding_work_has_series_of_its_own(fake_snapshots):
    from localserve.protocol.snapshot import EmbeddingRow

    snap = fake_snapshots[-1]
    counters = msgspec.structs.replace(
        snap.counters, embed_requests=3, embed_inputs=70, embed_tokens=900, embed_errors=1
    )
    rows = [
        EmbeddingRow("e1", "e1", "ann", "running", 64, 12, 700, 130, 3.0),
        EmbeddingRow("e2", "e2", "bob", "waiting", 2, 0, 20, 0, 1.5),
        EmbeddingRow("e3", "e3", "bob", "waiting", 2, 0, 20, 0, 1.5),
    ]
    text = render([msgspec.structs.replace(snap, counters=counters, embeddings=rows)])
    label = f'{{model_name="{snap.model.model}"}}'
    for name, value in [
        ("embedding_requests_total", "3"),
        ("embedding_inputs_total", "70"),
        ("embedding_tokens_total", "900"),
        ("embedding_errors_total", "1"),
        ("embedding_cancelled_total", "0"),
        ("num_embedding_requests_running", "1"),
        ("num_embedding_requests_waiting", "2"),
    ]:
        assert f"localserve:{name}{label} {value}" in text
    assert "ann" not in text and "bob" not in text  # never a user


def test_the_prefix_cache_tiers_have_a_series_each_by_tier(fake_snapshots):
    snap = fake_snapshots[-1]
    host = PrefixTier(True, "", 12, 340 << 20, 4 << 30, 5, 7100, 90 << 20, 20, 500 << 20, 3, 1)
    disk = PrefixTier(False, "no room on /var", 0, 0, 8 << 30, 2, 3000, 40 << 20)
    found = families(render(msgspec.structs.replace(snap, host_tier=host, disk_tier=disk)))
    expected = {
        "enabled": (1, 0),
        "entries": (12, 0),
        "bytes": (340 << 20, 0),
        "budget_bytes": (4 << 30, 8 << 30),
        "hits": (5, 2),
        "restored_tokens": (7100, 3000),
        "restored_bytes": (90 << 20, 40 << 20),
        "saved": (20, 0),
        "saved_bytes": (500 << 20, 0),
        "evictions": (3, 0),
        "failures": (1, 0),
    }
    assert len(expected) == len(TIER_METRICS)
    for name, values in expected.items():
        family = found[f"{PREFIX}prefix_cache_tier_{name}"]
        assert family.type == ("gauge" if name in ("enabled", "entries", "bytes", "budget_bytes")
                               else "counter")  # fmt: skip
        by_tier = {s.labels["tier"]: s.value for s in family.samples}
        assert by_tier == dict(zip(("host", "disk"), values, strict=True)), name
        assert all(s.labels["model_name"] == "fake" for s in family.samples)


def test_the_tiers_are_exported_off_and_zero_without_them(fake_snapshots):
    """An engine without tiers (and an older server's snapshot) still gives both series."""
    found = families(render(fake_snapshots[-1]))
    for name, _, _, _ in TIER_METRICS:
        samples = found[PREFIX + name.removesuffix("_total")].samples
        assert [(s.labels["tier"], s.value) for s in samples] == [("host", 0), ("disk", 0)]
