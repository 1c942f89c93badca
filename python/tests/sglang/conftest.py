"""The SGLang adapter tests run with the real sglang 0.5.23: `make test-sglang`
runs them in the cached engine venv. Without sglang they skip with the reason,
unless KVBM_REQUIRE_ENGINES=1 (CI), where they fail (hicache_harness.require_sglang)."""
import os

os.environ.setdefault("KVBM_DEVICE", "emulated")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
