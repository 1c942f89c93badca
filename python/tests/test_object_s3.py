"""The G4 object store on S3, through a worker: the location string selects it.

Needs the server `make test` starts (scripts/with-s3.sh); without one these
tests skip, or fail when KVBM_REQUIRE_S3=1."""
import os
import uuid

import numpy as np
import pytest

from kvbmgo import Tier, Worker
from kvbmgo.errors import InvalidArgumentError, KvbmIOError

from conftest import NUM_BLOCKS, clear, fill, new_worker_id, verify


@pytest.fixture
def s3_location():
    bucket = os.environ.get("KVBM_S3_BUCKET")
    if not bucket or not os.environ.get("AWS_ENDPOINT_URL_S3"):
        why = "no S3 server: KVBM_S3_BUCKET or AWS_ENDPOINT_URL_S3 is not set (`make test` starts one)"
        if os.environ.get("KVBM_REQUIRE_S3") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return bucket, f"s3://{bucket}/pytest/{uuid.uuid4().hex}"


def test_s3_round_trip(s3_location, g1_config):
    _, loc = s3_location
    layers = [np.zeros((NUM_BLOCKS, 2, 4, 64), dtype=np.uint16) for _ in range(4)]
    keys = [b"s3-block-%d" % i for i in range(NUM_BLOCKS)]
    ids = list(range(NUM_BLOCKS))
    with Worker(new_worker_id(), rank=1, object_dir=loc) as w:
        w.register_g1(g1_config, layers)
        assert w.object_has(keys) == [False] * NUM_BLOCKS
        fill(layers)
        w.object_put(keys, Tier.G1, ids)
        assert w.object_has(keys) == [True] * NUM_BLOCKS
    # Another worker of the same rank and location, as after a restart.
    with Worker(new_worker_id(), rank=1, object_dir=loc) as w:
        w.register_g1(g1_config, layers)
        clear(layers)
        w.object_get(keys, Tier.G1, ids)
        verify(layers, "G1 -> S3 -> G1")
    # Another rank sees none of them.
    with Worker(new_worker_id(), rank=2, object_dir=loc) as w:
        assert w.object_has(keys) == [False] * NUM_BLOCKS


def test_s3_location_errors(s3_location):
    bucket, _ = s3_location
    for bad in ["s3://", "s3://b/p?secret=x", "ftp://host/x"]:
        with pytest.raises(InvalidArgumentError, match="object store location"):
            Worker(new_worker_id(), object_dir=bad)
    with pytest.raises(KvbmIOError, match="does not exist"):
        Worker(new_worker_id(), object_dir="s3://kvbm-no-such-bucket/x")
