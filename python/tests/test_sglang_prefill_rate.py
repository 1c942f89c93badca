"""SGLang's prefill rate, learned from misses and the backups that follow
them (kvbmgo.sglang.prefill_rate)."""
from kvbmgo.sglang.prefill_rate import PrefillRate


def test_a_miss_and_the_backup_of_its_last_page_give_a_rate():
    r = PrefillRate(0, tokens_per_page=32)
    assert r.tokens_per_s() == 0  # unknown: the policy loads everything
    r.missed("k6", 4, now=10.0)  # pages k3..k6 missed
    r.backed_up(["k1", "k2"], now=10.5)  # not the missed pages
    r.backed_up(["k3", "k4"], now=10.6)  # a first chunk of them
    assert r.tokens_per_s() == 0
    r.backed_up(["k5", "k6"], now=11.0)
    assert r.tokens_per_s() == 4 * 32 / 1.0
    r.backed_up(["k6"], now=12.0)  # once per miss
    assert r.tokens_per_s() == 128


def test_the_median_of_recent_samples_is_the_rate():
    r = PrefillRate(0, tokens_per_page=16)
    for key, took in (("a", 2.0), ("b", 0.5), ("c", 0.01)):  # queued; alone; computed by another
        r.missed(key, 10, now=0.0)
        r.backed_up([key], now=took)
    assert r.tokens_per_s() == 320


def test_a_given_rate_is_kept():
    r = PrefillRate(5000, tokens_per_page=16)
    r.missed("a", 10, now=0.0)
    r.backed_up(["a"], now=1.0)
    assert r.tokens_per_s() == 5000


def test_clocks_are_bounded():
    r = PrefillRate(0, tokens_per_page=1)
    for i in range(5000):
        r.missed(f"k{i}", 1, now=float(i))  # noqa: one page each
    assert len(r._pending) <= 1024
    r.backed_up(["k0"], now=1e6)  # dropped long ago
    assert r.tokens_per_s() == 0
    r.backed_up(["k4999"], now=5000.0)
    assert r.tokens_per_s() == 1.0
