"""Disaggregated prefill->decode between two real SGLang engine processes
with kvbm's PD transfer backend, driven directly (both sides get the request
with the same bootstrap room, as sglang-router sends it): the decode's
tokens equal a single engine's, and the pages it received hold the bytes
the prefill sent (recording_pd.py)."""
import pytest

from e2e_common.model import free_port, prompt
from sglang_helpers import PAGE, Engine, Records


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return Records(str(tmp_path_factory.mktemp("pd-records")))


@pytest.fixture(scope="module")
def pd(model_dir, records):
    port = free_port()
    p = Engine(model_dir, records.path, "prefill", pd="prefill", bootstrap_port=port)
    try:
        d = Engine(model_dir, records.path, "decode", pd="decode", bootstrap_port=port)
    except BaseException:
        p.close()
        raise
    yield p, d, port
    d.close()
    p.close()


def test_prefill_decode_hand_over(pd, records, baseline):
    prefill, decode, port = pd
    ps = [prompt(30), prompt(31, 200)]
    rooms = [1001, 1002]
    boot = {"host": "127.0.0.1", "port": port, "rooms": rooms}
    prefill.send("generate", prompts=ps, max_tokens=8, bootstrap=boot)
    decode.send("generate", prompts=ps, max_tokens=8, bootstrap=boot)
    got, _ = decode.read(), prefill.read()
    assert got["tokens"] == baseline(ps, 8)
    taken = records.take()
    for room, p in zip(rooms, ps):
        full = len(p) // PAGE  # the decode writes its own tokens into the last page
        sent = [d for r in taken if r["ev"] == "pd-sent" and r["room"] == room
                for d in r["digests"]]
        received = [r["digests"] for r in taken if r["ev"] == "pd-received" and
                    r["room"] == room]
        assert len(received) == 1, taken
        assert len(sent) >= full and len(received[0]) >= full, (sent, received)
        assert received[0][:full] == sent[:full]
    print(f"PD: {[len(p) // PAGE for p in ps]} whole pages received, bytes equal")
