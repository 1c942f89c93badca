"""kvbmgo over the real CUDA backend and the CUDA double (cuda/testdriver):
`make test-cuda-double` runs this file with KVBM_CUDA_DOUBLE naming the
doubles it built (build/cuda-double); without it, every test skips."""
import os
import subprocess
import sys

import pytest

DOUBLE = os.environ.get("KVBM_CUDA_DOUBLE")

pytestmark = pytest.mark.skipif(
    not DOUBLE, reason="needs the CUDA double: KVBM_CUDA_DOUBLE=build/cuda-double "
                       "(set by make test-cuda-double, which builds it)")

# Runs in a child: the backend is opened once per process.
CREATE = """
import kvbmgo
try:
    with kvbmgo.Worker(5):
        print("backend", kvbmgo.info().device_backend)
except kvbmgo.errors.UnsupportedError as e:
    print("refused:", e)
"""


def _create_worker(variant):
    env = dict(os.environ, KVBM_DEVICE="cuda", LD_LIBRARY_PATH=os.path.join(DOUBLE, variant))
    out = subprocess.run([sys.executable, "-c", CREATE], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_worker_on_the_driver():
    assert _create_worker("default").strip() == "backend cuda"


def test_a_too_old_driver_fails_worker_creation():
    """A libcuda.so.1 without a symbol kvbm needs (the double's "old"
    variant: CUDA 10.2, no cuDevicePrimaryCtxRelease_v2) fails the worker's
    creation with one error naming the symbol and the driver's version."""
    out = _create_worker("old")
    assert out.startswith("refused: kvbm_worker_create: KVBM_ERR_UNSUPPORTED"), out
    assert ("libcuda.so.1 has no symbol cuDevicePrimaryCtxRelease_v2 (the installed driver is "
            "CUDA 10.2, older than that symbol: kvbm needs a newer driver)") in out
