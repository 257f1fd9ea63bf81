"""packaging/grafana-dashboard.json against the metrics nftblockd really exports: every query names a real
metric and label, parses in promtool, and the panels that sum evaluate to what they claim on series built
from the daemon's own registry."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_metrics import filled, promtool

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "packaging" / "grafana-dashboard.json"
SCRAPE_LABELS = {"instance", "job"}
# Grafana's variables, as a Prometheus query sees them once Grafana has substituted them
VARIABLES = {"$__rate_interval": "5m", "$instance": ".*", "$jail": ".*"}
# What an operator must find on the dashboard
MUST_SHOW = {
    "nftblock_set_elements", "nftblock_bans_total", "nftblock_unbans_total", "nftblock_allowlist_hits_total",
    "nftblock_ban_latency_seconds_bucket", "nftblock_netlink_batch_seconds_bucket",
    "nftblock_netlink_batch_elements_bucket", "nftblock_netlink_errors_total", "nftblock_lines_total",
    "nftblock_lines_invalid_total", "nftblock_lines_matched_total", "nftblock_failures_total",
    "nftblock_tracker_addresses", "nftblock_feed_fetch_total", "nftblock_feed_last_success_timestamp_seconds",
    "nftblock_feed_entries",
}


def exported() -> dict[str, tuple[str, set[str]]]:
    """Sample name -> (metric type, label names) of every sample a filled registry exposes."""
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in text_string_to_metric_families(filled().render().decode()):
        for s in fam.samples:
            out[s.name] = (fam.type, set(s.labels) - {"le"})
    return out


EXPORTED = exported()


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    d: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return d


def panel_exprs(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expression) of every query."""
    return [(p["title"], t["refId"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


def variable_selectors(d: dict[str, Any]) -> list[str]:
    """The series selectors inside the template variables' label_values(SELECTOR, label) queries."""
    out = []
    for v in d["templating"]["list"]:
        q = v.get("query")
        text = q.get("query", "") if isinstance(q, dict) else str(q or "")
        m = re.fullmatch(r"label_values\((.+), *\w+\)", text)
        if m:
            out.append(m.group(1))
    return out


def concrete(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def test_every_query_names_exported_metrics_and_their_labels(dashboard: dict[str, Any]) -> None:
    used = set()
    for title, _ref, e in panel_exprs(dashboard):
        names = re.findall(r"\bnftblock_\w+", e)
        assert names, title
        used.update(names)
        for n in names:
            assert n in EXPORTED, f"{title}: {n} is not exported"
            if EXPORTED[n][0] == "histogram":
                assert n.endswith(("_bucket", "_sum", "_count")), f"{title}: a histogram queried as {n}"
        allowed = set().union(*(EXPORTED[n][1] for n in names)) | SCRAPE_LABELS | {"le"}
        for group in re.findall(r"\bby \(([^)]*)\)", e):
            assert {g.strip() for g in group.split(",")} <= allowed, f"{title}: {e}"
        for matcher in re.findall(r"\{([^}]*)\}", e):
            assert {m.split("=")[0].strip(" !~") for m in matcher.split(",")} <= allowed, f"{title}: {e}"
    assert used >= MUST_SHOW, MUST_SHOW - used


def test_totals_of_set_elements_leave_the_allowlist_out(dashboard: dict[str, Any]) -> None:
    for title, _ref, e in panel_exprs(dashboard):
        if "nftblock_set_elements" in e and "by (set)" not in e:
            assert 'blocklist!="allow"' in e, f"{title} counts the allowlist as banned: {e}"


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    if tool is None:
        pytest.skip("promtool not installed (make deps extracts it)")
    return subprocess.run([tool, *args], capture_output=True, text=True, cwd=cwd, check=False)


def rules_file(path: Path, exprs: list[str]) -> Path:
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    return path


def test_every_query_parses_in_promtool(dashboard: dict[str, Any], tmp_path: Path) -> None:
    exprs = [concrete(e) for _t, _r, e in panel_exprs(dashboard)] + variable_selectors(dashboard)
    assert len(variable_selectors(dashboard)) == 2
    r = run_promtool("check", "rules", str(rules_file(tmp_path / "ok.yml", exprs)), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # and the check can fail: the search-and-replace accident that broke the latency panel once
    bad = "histogram_0.5uantile(q, sum by (le) (rate(nftblock_ban_latency_seconds_bucket[5m])))"
    r = run_promtool("check", "rules", str(rules_file(tmp_path / "bad.yml", [bad])), cwd=tmp_path)
    assert r.returncode != 0


def input_series() -> list[dict[str, str]]:
    """Every sample of a filled registry as a series of one instance, scraped each minute for 20 minutes:
    gauges constant, counters (and histogram parts) growing by their value each minute. Plus an allowlist
    set, which the totals must leave out."""
    out = []
    for fam in text_string_to_metric_families(filled().render().decode()):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted({**s.labels, "instance": "a"}.items()))
            grows = fam.type in ("counter", "histogram")
            out.append({"series": f"{s.name}{{{labels}}}",
                        "values": f"0+{s.value!r}x20" if grows else f"{s.value!r}x20"})
    out.append({"series": 'nftblock_set_elements{blocklist="allow",family="ipv4",instance="a",set="allow_net4"}',
                "values": "5x20"})
    return out


def panel(d: dict[str, Any], title: str, ref: str = "A") -> str:
    return concrete(next(e for t, r, e in panel_exprs(d) if t == title and r == ref))


def test_panels_evaluate_to_what_they_claim(dashboard: dict[str, Any], tmp_path: Path) -> None:
    rules_file(tmp_path / "none.yml", ["vector(1)"])
    checks = [
        (panel(dashboard, "Banned now"), [{"labels": "{}", "value": 3}]),  # not the 5 allowlist entries
        (panel(dashboard, "Elements per blocklist and family"),
         [{"labels": '{blocklist="default",family="ipv4"}', "value": 3}]),
        (panel(dashboard, "Tracked addresses"), [{"labels": "{}", "value": 2}]),
        (panel(dashboard, "Failures by jail", "B"), [{"labels": '{jail="sshd"}', "value": 2}]),
        # at 10 minutes, a copy fetched at the epoch's 1,700,000,000.5 s is that old
        (panel(dashboard, "Oldest feed data"), [{"labels": "{}", "value": 600 - 1_700_000_000.5}]),
        (panel(dashboard, "Feed entries"), [{"labels": '{feed="drop"}', "value": 1200}]),
        # three bans a minute, each 4 ms: the median is interpolated inside the 2.5-5 ms bucket
        (panel(dashboard, "Ban latency", "A"), [{"labels": "{}", "value": 0.00375}]),
        (panel(dashboard, "Lines read by source", "B"),
         [{"labels": '{reason="invalid_utf8",source="sshd"}', "value": 2 / 60},
          {"labels": '{reason="overlong",source="sshd"}', "value": 1 / 60}]),
    ]
    spec = {"rule_files": ["none.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": input_series(),
        "promql_expr_test": [{"expr": e, "eval_time": "10m", "exp_samples": exp} for e, exp in checks]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    r = run_promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_is_documented_and_importable(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] and dashboard["uid"] and dashboard["description"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"datasource", "instance"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] in ("row", "text"):
            continue
        assert p["description"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
