"""Disaggregated prefill->decode between two real SGLang engine processes
with kvbm's PD transfer backend, driven directly (both sides get the request
with the same bootstrap room, as sglang-router sends it): the decode's
tokens equal a single engine's, and the pages it received hold the bytes
the prefill sent (recording_pd.py)."""
import pytest

from e2e_common.model import prompt
from sglang_helpers import PAGE, Records, hand_over, pd_pair, require_pd_bytes


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return Records(str(tmp_path_factory.mktemp("pd-records")))


@pytest.fixture(scope="module")
def pd(model_dir, records):
    with pd_pair(model_dir, records, "") as pair:
        yield pair


def test_prefill_decode_hand_over(pd, records, baseline):
    prefill, decode, port = pd
    ps = [prompt(30), prompt(31, 200)]
    rooms = [1001, 1002]
    assert hand_over(prefill, decode, port, ps, rooms) == baseline(ps, 8)
    require_pd_bytes(records.take(), rooms, ps, PAGE)
    print(f"PD: {[len(p) // PAGE for p in ps]} whole pages received, bytes equal")
