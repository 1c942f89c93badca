"""SGLang's prefill rate, learned from misses and the backups that follow
them (kvbmgo.sglang.prefill_rate)."""
from kvbmgo.sglang.prefill_rate import PrefillRate


def test_a_miss_and_its_backup_give_a_rate():
    r = PrefillRate(0, tokens_per_page=32)
    assert r.tokens_per_s() == 0  # unknown: the policy loads everything
    r.missed("k3", 4, now=10.0)
    r.backed_up(["k1", "k2"], now=10.5)  # not the missed pages
    assert r.tokens_per_s() == 0
    r.backed_up(["k3", "k4"], now=11.0)
    assert r.tokens_per_s() == 4 * 32 / 1.0
    r.backed_up(["k3"], now=12.0)  # once per miss
    assert r.tokens_per_s() == 128


def test_the_highest_recent_sample_is_the_rate():
    r = PrefillRate(0, tokens_per_page=16)
    r.missed("a", 10, now=0.0)
    r.missed("b", 10, now=0.0)
    r.backed_up(["a"], now=2.0)  # waited in the queue: 80 tokens/s
    r.backed_up(["b"], now=0.5)  # 320 tokens/s
    assert r.tokens_per_s() == 320


def test_a_given_rate_is_kept():
    r = PrefillRate(5000, tokens_per_page=16)
    r.missed("a", 10, now=0.0)
    r.backed_up(["a"], now=1.0)
    assert r.tokens_per_s() == 5000


def test_clocks_are_bounded():
    r = PrefillRate(0, tokens_per_page=1)
    for i in range(5000):
        r.missed(f"k{i}", 1, now=float(i))
    assert len(r._pending) <= 1024
    r.backed_up(["k0"], now=1e6)  # dropped long ago
    assert r.tokens_per_s() == 0
    r.backed_up(["k4999"], now=5000.0)
    assert r.tokens_per_s() == 1.0
