"""/metrics of `serve --ray`: every replica's series with a `replica` label, plus their totals.

Each engine replica keeps the single server's metrics (integrations/server/metrics.py) in its own registry.
The ingress collects their expositions (`EngineReplica.metrics`, broadcast to all replicas) and
merges them: each sample gets the label `replica="<id>"`, and a sample of the same name and
labels summed over the replicas is added with `replica="all"` (counters, gauges and histogram
buckets, sums and counts all add up: total requests, total queue depth, total accepted drafts).
Dashboards of the single server read `{replica="all"}`; `sum without (replica)` would count
twice. `*_created` series (start timestamps) are left out: they do not add up.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

TOTAL = "all"


class _Families:
    """A prometheus_client collector over already-built metric families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def merge_expositions(per_replica: list[tuple[str, str]]) -> bytes:
    """[(replica id, Prometheus text)] -> one Prometheus text (module docstring)."""
    families: dict[str, Metric] = {}
    totals: dict[tuple, float] = {}
    order: list[tuple] = []
    for replica, text in sorted(per_replica):
        for fam in text_string_to_metric_families(text):
            if fam.name.endswith("_created"):
                continue
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                out.add_sample(s.name, {**s.labels, "replica": replica}, s.value)
                key = (fam.name, s.name, tuple(sorted(s.labels.items())))
                if key not in totals:
                    order.append(key)
                totals[key] = totals.get(key, 0.0) + s.value
    for key in order:
        fam_name, sample_name, labels = key
        families[fam_name].add_sample(sample_name, {**dict(labels), "replica": TOTAL},
                                      totals[key])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
