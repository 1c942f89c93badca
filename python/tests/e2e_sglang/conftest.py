"""Real-engine tests: SGLang 0.5.23's CPU engine generates from the tiny
random-weight Llama of e2e_common, and from its tiny hybrids (a
sliding-window one, a Mamba-kind one: e2e_common/hybrid_model.py), with and
without kvbm (HiCache storage, the PD transfer backend). `make test-e2e` runs them in the venv
scripts/engine-venv.sh keeps (engine sglang). Without sglang they skip with
the reason, unless KVBM_REQUIRE_ENGINES=1 (CI), where they fail.

Each engine is its own process (engine.py), driven over a pipe, with the
CPU stand-ins of standins/ on its PYTHONPATH; this process does not import
sglang."""
import importlib.metadata
import json
import os

import pytest

from e2e_common.engine_process import skip_or_require
from e2e_common.hybrid_model import make_lfm2_model, make_mellum_model
from e2e_common.model import make_model
from sglang_helpers import MAMBA_ENGINE, Engine

SGLANG = "0.5.23"


def _why_no_sglang():
    try:
        v = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return f"sglang is not installed here; make test-e2e runs these in the sglang " \
               f"{SGLANG} venv"
    if v != SGLANG:
        return f"sglang {v} here, these tests are for {SGLANG}"
    return None


def pytest_collection_modifyitems(config, items):
    skip_or_require("e2e_sglang", _why_no_sglang(), items)


def _made(tmp_path_factory, name, make):
    """A tiny model made by make in pytest's temporary directory, the
    engines' logs beside it."""
    os.environ.setdefault("KVBM_E2E_LOGDIR", str(tmp_path_factory.getbasetemp()))
    path = str(tmp_path_factory.mktemp(name))
    make(path)
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return _made(tmp_path_factory, "tiny-llama", make_model)


@pytest.fixture(scope="session")
def baseline(model_dir, tmp_path_factory):
    """The engine without kvbm (no HiCache): the tokens every scenario must
    give. One for the session (test_hicache and test_pd): it sleeps while
    idle (_expected_tokens)."""
    yield from _expected_tokens(model_dir, tmp_path_factory, "baseline")


@pytest.fixture(scope="session")
def swa_model_dir(tmp_path_factory):
    """The tiny sliding-window hybrid (e2e_common/hybrid_model.py)."""
    return _made(tmp_path_factory, "tiny-mellum", make_mellum_model)


@pytest.fixture(scope="module")
def swa_baseline(swa_model_dir, tmp_path_factory):
    """The sliding-window hybrid's engine without kvbm."""
    yield from _expected_tokens(swa_model_dir, tmp_path_factory, "swa-baseline")


@pytest.fixture(scope="session")
def lfm2_model_dir(tmp_path_factory):
    """The tiny Mamba-kind hybrid (e2e_common/hybrid_model.py: LFM2's short
    convolution beside full attention)."""
    return _made(tmp_path_factory, "tiny-lfm2", make_lfm2_model)


@pytest.fixture(scope="module")
def lfm2_baseline(lfm2_model_dir, tmp_path_factory):
    """The Mamba-kind hybrid's engine without kvbm (its engine arguments:
    engine.MAMBA_ENGINE)."""
    yield from _expected_tokens(lfm2_model_dir, tmp_path_factory, "lfm2-baseline",
                                MAMBA_ENGINE)


def _expected_tokens(model, tmp_path_factory, name, engine=None):
    """expect(prompts, max_tokens): the tokens of model's engine without
    kvbm, each once. The engine loads while the test's kvbm engines do, and
    sleeps while idle (SGLang's sleep_on_idle; else its scheduler keeps
    polling, about 65% of a core, and slows every other engine)."""
    e = Engine(model, str(tmp_path_factory.mktemp(name)), name,
               engine=dict(engine or {}, sleep_on_idle=True))
    cache = {}

    def expect(prompts, max_tokens):
        key = (json.dumps(prompts), max_tokens)
        if key not in cache:
            cache[key] = e.generate(prompts, max_tokens)["tokens"]
        return cache[key]
    yield expect
    e.close()
