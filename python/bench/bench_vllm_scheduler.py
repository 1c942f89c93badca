"""KvbmConnector's scheduler side: get_num_new_matched_tokens for a 32k-token
prompt (2,048 blocks, all cached), beside a bare Python loop of 2,048 dict
lookups (the least any index walk costs). Needs vllm (make bench-vllm)."""
import hashlib
import time
import types

from kvbmgo.vllm.config import KvbmConfig
from kvbmgo.vllm.scheduler import KvbmScheduler

BLOCKS, BLOCK = 2048, 16


def main() -> None:
    s = KvbmScheduler(KvbmConfig(), BLOCK)
    hashes = [hashlib.sha256(str(i).encode()).digest() for i in range(BLOCKS)]
    s.apply_events([(1, 2, h) for h in hashes])
    s.take_events()
    r = types.SimpleNamespace(request_id="r", block_hashes=hashes,
                              num_tokens=BLOCKS * BLOCK + 1)
    assert s.get_num_new_matched_tokens(r, 0) == (BLOCKS * BLOCK, False)
    n = 500
    t = time.perf_counter()
    for _ in range(n):
        s.get_num_new_matched_tokens(r, 0)
    match = (time.perf_counter() - t) / n
    index = s._tiers
    t = time.perf_counter()
    for _ in range(n):
        for h in hashes:
            h in index  # noqa: B015 - the bare lookup
    bare = (time.perf_counter() - t) / n
    print(f"get_num_new_matched_tokens, {BLOCKS:,} cached blocks: {match * 1e6:.0f} us; "
          f"bare loop of {BLOCKS:,} dict lookups: {bare * 1e6:.0f} us "
          f"({match / bare:.2f}x); target <= 200 us")


if __name__ == "__main__":
    main()
