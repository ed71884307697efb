"""Reading docs/grafana/localserve.json: its panels, its PromQL and the series they select."""

from __future__ import annotations

import json
import re

from tests.support.paths import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "localserve.json"


METRIC = re.compile(r"\b(localserve:[A-Za-z_][A-Za-z0-9_]*)(\{[^}]*\})?")


HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside rows included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def queries(dashboard: dict) -> list[str]:
    """Every PromQL expression: panel targets and the template variables' queries."""
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def queried_names(dashboard: dict) -> set[str]:
    """The series names the expressions select, as written (`..._bucket` included)."""
    return {m.group(1) for e in queries(dashboard) for m in METRIC.finditer(e)}
