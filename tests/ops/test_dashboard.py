"""deploy/grafana-dashboard.json only queries metrics that /metrics exports."""

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import ROOT

SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


@pytest.mark.django_db
def test_every_dashboard_query_names_an_exported_metric(client):
    client.get("/healthz")  # at least one request, so the HTTP series exist
    text = client.get("/metrics").content.decode()
    exported = {family.name for family in text_string_to_metric_families(text)}
    dashboard = json.loads((ROOT / "deploy/grafana-dashboard.json").read_text())
    names = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"by \([^)]*\)", "", target["expr"])  # label lists
            names |= set(re.findall(r"\b([a-z_]+)(?=[{\[)])", expr))
    assert "payments_callback_inbox_depth" in names
    assert names
    for name in sorted(names):
        base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
        assert base in exported, f"{name}: not exported by /metrics"
