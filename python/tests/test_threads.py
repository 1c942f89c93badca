"""Several threads transferring through one worker at once."""
import threading

import numpy as np

from kvbmgo import Tier

from conftest import NUM_BLOCKS, fill, pattern


def test_concurrent_transfers(worker):
    w, layers = worker
    fill(layers)
    errors = []
    barrier = threading.Barrier(8)

    def run(t):
        try:
            barrier.wait()
            blk = t % NUM_BLOCKS
            for _ in range(25):
                with w.transfer(Tier.G1, [blk], Tier.G2, [blk]) as n:
                    assert n.wait(10)
                with w.transfer(Tier.G2, [blk], Tier.G3, [blk]) as n:
                    assert n.wait(10)
                with w.transfer(Tier.G3, [blk], Tier.G1, [blk]) as n:
                    assert n.wait(10)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    for l, a in enumerate(layers):
        np.testing.assert_array_equal(a, pattern(l, a.shape))
