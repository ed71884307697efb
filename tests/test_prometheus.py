"""`/metrics` text (localserve/prometheus.py): a snapshot rendered in Prometheus's format."""

from __future__ import annotations

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from localserve.prometheus import HISTOGRAMS, PREFIX, render


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_snapshot_renders_as_parseable_text_with_the_model_label_only(fake_snapshots):
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
    assert labels == {"model_name", "le"}  # never the user: cardinality, privacy


def test_kv_usage_leaves_out_cells_only_cached_prefixes_hold(fake_snapshots):
    snap = fake_snapshots[-1]
    usage = families(render(snap))[PREFIX + "kv_cache_usage_perc"].samples[0].value
    assert usage == (snap.kv_used - snap.kv_cached) / snap.kv_total


def test_a_model_name_is_escaped_in_the_label(fake_snapshots):
    snap = fake_snapshots[0]
    odd = msgspec.structs.replace(snap, model=msgspec.structs.replace(snap.model, model='a"b\\c'))
    sample = families(render(odd))[PREFIX + "num_requests_waiting"].samples[0]
    assert sample.labels == {"model_name": 'a"b\\c'}
