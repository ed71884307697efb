"""docs/grafana/localserve.json on its own: a Grafana dashboard on a chosen Prometheus, every query
selecting the chosen model, the panels a vLLM dashboard has (of the series
localserve/ops/prometheus.py exports; that /metrics has them is e2e/test_grafana_metrics.py)."""

from __future__ import annotations

from tests.support.grafana import HISTOGRAM_SUFFIXES, METRIC, load, panels, queried_names

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus():
    dashboard = load()
    assert dashboard["title"] == "localserve" and dashboard["uid"]
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["DS_PROMETHEUS"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    model = variables["model_name"]
    assert model["type"] == "query" and model["datasource"] == DATASOURCE
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE and panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        assert all(t["datasource"] == DATASOURCE for t in panel["targets"])


def test_every_query_selects_the_chosen_model():
    for expr in (t["expr"] for p in panels(load()) for t in p.get("targets", [])):
        for match in METRIC.finditer(expr):
            assert match.group(2) == '{model_name="$model_name"}', (match.group(1), expr)


def test_the_dashboard_shows_what_a_vllm_dashboard_shows():
    names = set()
    for name in queried_names(load()):
        for suffix in HISTOGRAM_SUFFIXES:
            name = name.removesuffix(suffix)
        names.add(name)
    for family in (
        "e2e_request_latency_seconds",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "request_time_per_output_token_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "request_success_total",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
    ):
        assert "localserve:" + family in names, family
