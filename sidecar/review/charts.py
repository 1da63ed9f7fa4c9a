"""The report's charts as SVG text, drawn by pygal with its JavaScript switched off.

pygal's default configuration links a tooltip script from a CDN; ``js=[]`` drops it, so
a chart is plain SVG that renders offline inside the HTML file.  The only URLs left are
the SVG and XLink namespace names, which are identifiers, never fetched (pygal's
signature comments, which name its web site, are removed).
"""

from __future__ import annotations

import re

import pygal
from pygal.style import Style

from sidecar.review.figures import Latency, Leases

_STYLE = Style(
    background="white",
    plot_background="white",
    font_family="sans-serif",
    colors=("#4e79a7", "#f28e2b", "#e15759", "#59a14f"),
)


def _config(title: str) -> pygal.Config:
    config = pygal.Config()
    config.js = []
    config.disable_xml_declaration = True  # inlined in HTML, not a document of its own
    config.style = _STYLE
    config.title = title
    config.width = 760
    config.height = 380
    config.legend_at_bottom = True
    config.print_values = False
    return config


_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_SCRIPT = re.compile(r"<script\b.*?</script>", re.DOTALL)


def _svg(chart: pygal.graph.graph.Graph) -> str:
    # pygal signs its SVG with comments naming its web site: dropped, so the report
    # names no address but the namespaces.
    # It also inlines its tooltip configuration as a script, of no use without the
    # tooltip code: dropped, so the report runs no script at all.
    return _SCRIPT.sub("", _COMMENT.sub("", str(chart.render(is_unicode=True))))


def stages_against_lease(leases: Leases) -> str:
    """Per stage: p50, p95 and longest duration beside the lease it ran under (s)."""
    chart = pygal.Bar(_config("Stage durations against the lease (seconds)"))
    chart.x_labels = [s.stage for s in leases.by_stage]
    chart.add("p50", [s.p50_s for s in leases.by_stage])
    chart.add("p95", [s.p95_s for s in leases.by_stage])
    chart.add("longest", [s.max_s for s in leases.by_stage])
    chart.add("lease (ttl_s)", [s.lease_s for s in leases.by_stage])
    return _svg(chart)


def lease_share(leases: Leases) -> str:
    """How many stages took what share of their lease."""
    chart = pygal.Bar(_config("Stages by the share of their lease they took"))
    chart.x_labels = [b.label for b in leases.ratio_buckets]
    chart.add("stages", [b.count for b in leases.ratio_buckets])
    return _svg(chart)


def write_latency(latencies: list[Latency]) -> str:
    """p50/p95/p99/max of each measured write latency (ms)."""
    chart = pygal.Bar(_config("Write latency (milliseconds)"))
    chart.x_labels = ["p50", "p95", "p99", "max"]
    for latency in latencies:
        s = latency.samples
        chart.add(latency.what, [s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms])
    return _svg(chart)
