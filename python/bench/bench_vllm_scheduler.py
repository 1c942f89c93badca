"""KvbmConnector's scheduler side, for 32k-token requests (2,048 blocks):

- get_num_new_matched_tokens with all blocks cached, beside a bare Python
  loop of 2,048 dict lookups (the least any index walk costs);
- a hit's step (match, update_state_after_alloc's load, build_connector_meta)
  and a step with nothing to move (running requests each decoding a token:
  build_connector_meta and update_connector_output), each with 1 KV cache
  group and with 3 (vLLM's hybrid KV cache manager: full attention and two
  sliding windows, groups.py), in the same run.

Each figure is printed beside its baseline and its limit as ratios. Needs
vllm (make bench-vllm). Not a test: it prints figures, it asserts none."""
import gc
import hashlib
import statistics
import time
import types

from kvbmgo.vllm.config import KvbmConfig
from kvbmgo.vllm.groups import KvGroup, KvGroups
from kvbmgo.vllm.scheduler import KvbmScheduler

BLOCKS, BLOCK = 2048, 16
#: The sliding windows' tokens (gpt-oss's is 128).
WINDOW = 128
#: Requests running in a nothing-to-move step.
RUNNING = 8
MATCH_LIMIT_US, STEP_LIMIT_US = 200, 50


def groups_of(n: int) -> KvGroups:
    """1: one group (not hybrid); 3: full attention + two sliding windows."""
    if n == 1:
        return KvGroups.single(BLOCK)
    kept = (KvGroup(0, "full", BLOCK),) + tuple(KvGroup(i, "window", BLOCK, WINDOW)
                                                for i in range(1, n))
    return KvGroups(kept, n, BLOCK)


def tables(groups: KvGroups, first: int) -> tuple:
    """A 2,048-block request's tables: a window's null before its window."""
    out = []
    for g in groups.kept:
        ids = list(range(first + g.index * BLOCKS, first + (g.index + 1) * BLOCKS))
        if g.kind == "window":
            keep = BLOCKS - g.first_kept_block(BLOCKS * BLOCK)
            ids = [0] * (BLOCKS - keep) + ids[-keep:]
        out.append(ids)
    return tuple(out)


class Blocks:
    def __init__(self, t: tuple) -> None:
        self.t = t

    def get_block_ids(self) -> tuple:
        return self.t


def scheduler(groups: KvGroups, hashes: list) -> KvbmScheduler:
    s = KvbmScheduler(KvbmConfig(), BLOCK, groups=groups)
    s.apply_events([(1, 2, groups.key(h, g)) for h in hashes for g in groups.kept])
    s.take_events()
    return s


def request(req_id: str, hashes: list):
    return types.SimpleNamespace(request_id=req_id, block_hashes=hashes,
                                 num_tokens=BLOCKS * BLOCK + 1, kv_transfer_params=None,
                                 prompt_token_ids=None, all_token_ids=[1] * (BLOCKS * BLOCK + 1))


def output(new=(), cached=(), computed=0):
    """A SchedulerOutput as build_connector_meta reads it."""
    c = types.SimpleNamespace(req_ids=list(cached), new_block_ids=[None] * len(cached),
                              num_computed_tokens=[computed] * len(cached),
                              resumed_req_ids=set())
    sched = {r.req_id: 1 for r in new}
    sched.update({r: 1 for r in cached})
    return types.SimpleNamespace(scheduled_new_reqs=list(new), scheduled_cached_reqs=c,
                                 num_scheduled_tokens=sched, preempted_req_ids=None)


def median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1000


def measure(n_groups: int, hashes: list) -> dict:
    groups = groups_of(n_groups)
    s = scheduler(groups, hashes)
    r = request("r", hashes)
    assert s.get_num_new_matched_tokens(r, 0)[0] == BLOCKS * BLOCK
    out = {"match": median_us(lambda: s.get_num_new_matched_tokens(r, 0), 300)}
    t = tables(groups, 1)
    full = tuple(t[i] if i < len(t) else [] for i in range(n_groups))
    i = [0]

    def hit_step():
        i[0] += 1
        rq = request(f"h{i[0]}", hashes)
        n, _ = s.get_num_new_matched_tokens(rq, 0)
        s.update_state_after_alloc(rq, Blocks(full), n)
        new = types.SimpleNamespace(req_id=rq.request_id, block_ids=full,
                                    num_computed_tokens=n)
        md = s.build_connector_meta(output(new=[new]))
        s.request_finished(rq, [])
        return md
    md = hit_step()
    out["loaded"] = sum(len(ld.block_ids) for ld in md.loads)
    out["hit"] = median_us(hit_step, 200)

    # Running requests, every block computed and offered: a decode step.
    running = [f"d{k}" for k in range(RUNNING)]
    for rid in running:
        rq = request(rid, hashes)
        s.get_num_new_matched_tokens(rq, 0)
        s.update_state_after_alloc(rq, Blocks(full), BLOCKS * BLOCK)
        new = types.SimpleNamespace(req_id=rid, block_ids=full,
                                    num_computed_tokens=BLOCKS * BLOCK)
        s.build_connector_meta(output(new=[new]))
    so = output(cached=running, computed=BLOCKS * BLOCK)
    empty = types.SimpleNamespace(kv_connector_worker_meta=None)

    def idle_step():
        md = s.build_connector_meta(so)
        s.update_connector_output(empty)
        return md
    md = idle_step()
    assert not md.loads and not md.stores
    out["idle"] = median_us(idle_step, 2000)
    return out


def main() -> None:
    gc.disable()
    hashes = [hashlib.sha256(str(i).encode()).digest() for i in range(BLOCKS)]
    one, three = measure(1, hashes), measure(3, hashes)
    index = {h: {2} for h in hashes}
    n = 300
    t = time.perf_counter()
    for _ in range(n):
        for h in hashes:
            h in index  # noqa: B015 - the bare lookup
    bare = (time.perf_counter() - t) / n * 1e6
    print(f"bare loop of {BLOCKS:,} dict lookups: {bare:.0f} us (the baseline)")
    print(f"get_num_new_matched_tokens, {BLOCKS:,} cached blocks, 1 group: "
          f"{one['match']:.0f} us ({one['match'] / bare:.2f}x bare; "
          f"{one['match'] / MATCH_LIMIT_US:.2f}x the {MATCH_LIMIT_US} us limit)")
    print(f"get_num_new_matched_tokens, {BLOCKS:,} cached blocks, 3 groups: "
          f"{three['match']:.0f} us ({three['match'] / one['match']:.2f}x 1 group; "
          f"{three['match'] / bare:.2f}x bare; "
          f"{three['match'] / MATCH_LIMIT_US:.2f}x the {MATCH_LIMIT_US} us limit)")
    print(f"hit step (match, alloc, meta) of a {BLOCKS:,}-block request, 1 group "
          f"({one['loaded']:,} blocks loaded): {one['hit']:.0f} us "
          f"({one['hit'] / bare:.2f}x bare)")
    print(f"hit step (match, alloc, meta) of a {BLOCKS:,}-block request, 3 groups "
          f"({three['loaded']:,} blocks loaded): {three['hit']:.0f} us "
          f"({three['hit'] / one['hit']:.2f}x 1 group; {three['hit'] / bare:.2f}x bare)")
    for label, fig in (("1 group", one), ("3 groups", three)):
        print(f"nothing-to-move step, {RUNNING} running {BLOCKS:,}-block requests, {label}: "
              f"{fig['idle']:.1f} us ({fig['idle'] / STEP_LIMIT_US:.2f}x the "
              f"{STEP_LIMIT_US} us limit" +
              (f"; {fig['idle'] / one['idle']:.2f}x 1 group)" if fig is three else ")"))


if __name__ == "__main__":
    main()
