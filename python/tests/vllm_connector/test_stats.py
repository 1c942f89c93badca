"""kvbm's figures reach vLLM's own metrics: the stats the connector returns
travel in vLLM's SchedulerStats, and vLLM's KVConnectorProm and
KVConnectorLogging (what its Prometheus and periodic loggers use) record
them in the real prometheus_client registry and the interval's log line."""
from harness import require_vllm

require_vllm()

from prometheus_client import REGISTRY  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: E402
    KVConnectorLogging, KVConnectorProm)

from harness import BLOCK, Engine  # noqa: E402

LABELS = {"model_name": "tiny-llama", "engine": "0"}


def _fresh_prom(e):
    """vLLM's KVConnectorProm over the default registry, kvbm's metrics
    registered anew (vLLM unregisters its metrics the same way)."""
    for c in list(REGISTRY._collector_to_names):
        if any(n.startswith("vllm:kvbm_") for n in REGISTRY._collector_to_names[c]):
            REGISTRY.unregister(c)
    return KVConnectorProm(e.vc, list(LABELS), {0: list(LABELS.values())})


def flush(e):
    """A step after the worker side's next read of the cache's counters is
    due (it reads them at most every _STATS_EVERY_S)."""
    import time
    from kvbmgo.vllm.worker_stats import _STATS_EVERY_S
    time.sleep(_STATS_EVERY_S + 0.01)
    e.settle()


def value(name, **labels):
    return REGISTRY.get_sample_value(name, {**LABELS, **labels}) or 0


def test_offload_and_onboard_show_in_vllms_prometheus_registry_and_log():
    e = Engine({"g2_blocks": 32})
    try:
        prom = _fresh_prom(e)
        logging_ = KVConnectorLogging(e.vc.kv_transfer_config)
        prompt = list(range(100, 100 + 2 * BLOCK + 8))
        e.add("A", prompt)
        e.run()
        flush(e)
        for d in e.stats:
            prom.observe(d, 0)
        block_bytes = e.worker._worker._block_bytes
        assert value("vllm:kvbm_offloaded_blocks_total") == 2
        assert value("vllm:kvbm_offloaded_bytes_total") == 2 * block_bytes
        assert value("vllm:kvbm_store_time_seconds_count") >= 1
        assert value("vllm:kvbm_onboarded_blocks_total", tier="G2") == 0
        seen = len(e.stats)
        assert e.sched.reset_prefix_cache()
        e.raw.zero_()
        e.add("B", prompt[:2 * BLOCK] + list(range(500, 510)))
        e.run()
        flush(e)
        for d in e.stats[seen:]:
            prom.observe(d, 0)
        for d in e.stats:
            logging_.observe(d)
        assert value("vllm:kvbm_onboarded_blocks_total", tier="G2") == 2
        assert value("vllm:kvbm_onboarded_tokens_total", tier="G2") == 2 * BLOCK
        assert value("vllm:kvbm_onboarded_bytes_total") == 2 * block_bytes
        assert value("vllm:kvbm_hit_tokens_total") == 2 * BLOCK
        # A looked up 2 blocks (nothing cached), B 2 (both hit).
        assert value("vllm:kvbm_lookup_tokens_total") == 4 * BLOCK
        assert value("vllm:kvbm_load_time_seconds_count") >= 1
        assert value("vllm:kvbm_failed_blocks_total", cause="load") == 0
        lines = []
        logging_.log(log_fn=lambda fmt, *a: lines.append(fmt % a))
        assert len(lines) == 1 and "hit_rate_G2=0.5" in lines[0], lines
        assert "onboarded_blocks=2" in lines[0] and "offloaded_blocks=2" in lines[0], lines
    finally:
        e.close()


def test_a_failed_load_is_counted_by_cause():
    from test_connector import _lost_block_run
    e = Engine({"g2_blocks": 32})
    try:
        prom = _fresh_prom(e)
        _lost_block_run(e)
        flush(e)
        for d in e.stats:
            prom.observe(d, 0)
        assert value("vllm:kvbm_failed_blocks_total", cause="load") == 1
        assert value("vllm:kvbm_onboarded_blocks_total", tier="G2") == 2
    finally:
        e.close()
