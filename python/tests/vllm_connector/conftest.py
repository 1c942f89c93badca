"""The vLLM connector tests run with the real vllm 0.33.0 and 0.34.0: `make test-vllm`
runs them in the cached engine venv. Without vllm they skip with the reason,
unless KVBM_REQUIRE_ENGINES=1 (CI), where they fail (see harness.require_vllm)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
