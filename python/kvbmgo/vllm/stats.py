"""kvbm's figures in vLLM's own metrics: the stats each interval carries from
the workers (and the scheduler side) to vLLM's logger, and the Prometheus
metrics they feed.

vLLM (0.32 to 0.34) asks every step for ``get_kv_connector_stats()`` on the worker
side and on the scheduler side, aggregates what comes back across workers
(``aggregate``), sends it to its front-end process as ``to_dict()``, rebuilds
it there with ``KvbmConnector.build_kv_connector_stats(data)``, logs
``reduce()`` every interval and records it in the metrics that
``build_prom_metrics`` registered. So the payload is a plain dict of
numbers, dicts of numbers and lists of observations (no tuples, nothing
that needs this module on the receiving side).

Blocks and tokens are counted by rank 0 only (every rank loads and stores
the same blocks, each its own share of their bytes); bytes by every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorPromMetrics,
                                                                  KVConnectorStats)

__all__ = ["KvbmConnectorStats", "KvbmPromMetrics", "TIERS", "FAILURE_CAUSES"]

#: The tiers a load is served from, as kvbm names them.
TIERS = ("G2", "G3", "G4")
#: Why a block did not arrive (load, pull) or was not kept (store, computed
#: over a failed load).
FAILURE_CAUSES = ("load", "store", "pull", "computed_over_failed_load")

_COUNTS = ("lookup_tokens", "hit_tokens", "offloaded_blocks", "offloaded_bytes",
           "onboarded_bytes", "pulls", "pull_blocks", "pull_bytes", "pull_failures",
           "declined_tokens")
_BY = {"onboarded_blocks": TIERS, "onboarded_tokens": TIERS, "failed_blocks": FAILURE_CAUSES}
_SERIES = ("load_seconds", "store_seconds", "pull_seconds")
#: At most this many observations of each series per payload (an interval
#: of a busy engine); the counts stay exact.
_MAX_SERIES = 8192


def _empty() -> Dict[str, Any]:
    d: Dict[str, Any] = {k: 0 for k in _COUNTS}
    d.update({k: {label: 0 for label in labels} for k, labels in _BY.items()})
    d.update({k: [] for k in _SERIES})
    return d


@dataclass
class KvbmConnectorStats(KVConnectorStats):
    """One interval's kvbm figures (see the module docstring for the shape)."""

    def __post_init__(self) -> None:
        base = _empty()
        for k, v in (self.data or {}).items():
            if k in _BY:
                base[k].update(v)
            elif k in base:
                base[k] = list(v) if k in _SERIES else v
        self.data = base

    def reset(self) -> None:
        self.data = _empty()

    # ---- what the connector records

    def add(self, key: str, n: float = 1, label: Optional[str] = None) -> None:
        if label is None:
            self.data[key] += n
        else:
            self.data[key][label] += n

    def observe(self, series: str, seconds: float) -> None:
        obs: List[float] = self.data[series]
        if len(obs) < _MAX_SERIES:
            obs.append(seconds)

    # ---- what vLLM calls

    def aggregate(self, other: KVConnectorStats) -> "KvbmConnectorStats":
        if not isinstance(other, KvbmConnectorStats):
            other = KvbmConnectorStats(data=dict(other.data))
        for k in _COUNTS:
            self.data[k] += other.data[k]
        for k, labels in _BY.items():
            for label in labels:
                self.data[k][label] += other.data[k][label]
        for k in _SERIES:
            self.data[k].extend(other.data[k][:_MAX_SERIES - len(self.data[k])])
        return self

    def is_empty(self) -> bool:
        d = self.data
        return (not any(d[k] for k in _COUNTS) and not any(d[k] for k in _SERIES)
                and not any(any(d[k].values()) for k in _BY))

    def reduce(self) -> Dict[str, int | float]:
        """The interval in one line: hit rate by tier (tokens loaded from
        it / tokens looked up), blocks and GB moved, mean transfer times,
        failures, P/D pulls."""
        d = self.data
        out: Dict[str, int | float] = {}
        looked = d["lookup_tokens"]
        for tier in TIERS:
            out[f"hit_rate_{tier}"] = round(d["onboarded_tokens"][tier] / looked, 4) \
                if looked else 0.0
        out["onboarded_blocks"] = sum(d["onboarded_blocks"].values())
        out["offloaded_blocks"] = d["offloaded_blocks"]
        out["onboarded_GB"] = round(d["onboarded_bytes"] / 1e9, 3)
        out["offloaded_GB"] = round(d["offloaded_bytes"] / 1e9, 3)
        for k in _SERIES:
            obs = d[k]
            out[f"mean_{k[:-8]}_ms"] = round(1e3 * sum(obs) / len(obs), 3) if obs else 0.0
        out["failed_blocks"] = sum(d["failed_blocks"].values())
        if d["pulls"]:
            out["pd_pulls"] = d["pulls"]
            out["pd_pull_failures"] = d["pull_failures"]
        return out


_TIME_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0, 10.0, 30.0)


class KvbmPromMetrics(KVConnectorPromMetrics):
    """kvbm's Prometheus metrics, named as vLLM names its connectors'
    (vllm:<connector>_..., counters ending in _total), with vLLM's labels
    (model name, engine) and kvbm's own (tier, cause)."""

    def __init__(self, vllm_config: Any, metric_types: Dict[type, type],
                 labelnames: List[str], per_engine_labelvalues: Dict[int, List[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        names = list(labelnames)

        def counter(name: str, doc: str, extra: Optional[List[str]] = None) -> Any:
            return self._counter_cls(name=name, documentation=doc,
                                     labelnames=names + (extra or []))

        def histogram(name: str, doc: str) -> Any:
            return self._histogram_cls(name=name, documentation=doc, labelnames=names,
                                       buckets=_TIME_BUCKETS)

        self._counters = {
            "lookup_tokens": counter("vllm:kvbm_lookup_tokens_total",
                                     "Prompt tokens beyond the GPU's prefix hit looked up in "
                                     "kvbm's cache."),
            "hit_tokens": counter("vllm:kvbm_hit_tokens_total",
                                  "Tokens kvbm's cache matched (loaded instead of computed)."),
            "declined_tokens": counter("vllm:kvbm_declined_tokens_total",
                                       "Tokens kvbm's cache held but the load policy had "
                                       "recomputed: loading them was expected to take longer "
                                       "(load_policy auto)."),
            "onboarded_tokens": counter("vllm:kvbm_onboarded_tokens_total",
                                        "Tokens loaded into the GPU from kvbm, by the tier "
                                        "that held them.", ["tier"]),
            "onboarded_blocks": counter("vllm:kvbm_onboarded_blocks_total",
                                        "Blocks loaded into the GPU from kvbm, by tier.",
                                        ["tier"]),
            "onboarded_bytes": counter("vllm:kvbm_onboarded_bytes_total",
                                       "Bytes loaded into the GPU by kvbm, from its tiers and from "
                                       "prefill instances (P/D pulls; all ranks)."),
            "offloaded_blocks": counter("vllm:kvbm_offloaded_blocks_total",
                                        "Blocks stored from the GPU into kvbm's G2."),
            "offloaded_bytes": counter("vllm:kvbm_offloaded_bytes_total",
                                       "Bytes stored from the GPU into kvbm (all ranks)."),
            "failed_blocks": counter("vllm:kvbm_failed_blocks_total",
                                     "Blocks that did not arrive (load, pull) or were not "
                                     "kept (store, computed_over_failed_load).", ["cause"]),
            "pulls": counter("vllm:kvbm_pd_pulls_total",
                             "Disaggregated P/D pulls of a request's blocks that ended."),
            "pull_failures": counter("vllm:kvbm_pd_pull_failures_total",
                                     "P/D pulls that failed one block or more."),
            "pull_bytes": counter("vllm:kvbm_pd_pull_bytes_total",
                                  "Bytes pulled from prefill instances (all ranks)."),
        }
        self._histograms = {
            "load_seconds": histogram("vllm:kvbm_load_time_seconds",
                                      "Time from the start of a load from kvbm to its end, "
                                      "as the connector saw it."),
            "store_seconds": histogram("vllm:kvbm_store_time_seconds",
                                       "Time from the start of a store into kvbm to its end, "
                                       "as the connector saw it."),
            "pull_seconds": histogram("vllm:kvbm_pd_pull_time_seconds",
                                      "Time from the start of a P/D pull to its end."),
        }

    def _child(self, metric: Any, engine_idx: int, *extra: str) -> Any:
        return metric.labels(*self.per_engine_labelvalues[engine_idx], *extra)

    def observe(self, transfer_stats_data: Dict[str, Any], engine_idx: int = 0) -> None:
        d = KvbmConnectorStats(data=transfer_stats_data).data
        for key, metric in self._counters.items():
            if key in _BY:
                for label, n in d[key].items():
                    if n:
                        self._child(metric, engine_idx, label).inc(n)
            elif d[key]:
                self._child(metric, engine_idx).inc(d[key])
        for key, metric in self._histograms.items():
            if d[key]:
                child = self._child(metric, engine_idx)
                for seconds in d[key]:
                    child.observe(seconds)
