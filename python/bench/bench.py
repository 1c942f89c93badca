"""Python-side overhead of kvbmgo, beside bare ctypes calls measured in the same run.

Run: make bench-py. Prints ns or µs per call; the
"overhead" lines are the wrapper's time minus the bare ctypes call's.
"""
import ctypes
import gc
import statistics
import time
import types
from ctypes import byref, c_int32, c_size_t, c_void_p

import numpy as np

import kvbmgo
from kvbmgo import (ActionKind, FactKind, HandoffCoordinator, HandoffOrder, LayoutConfig,
                    OutcomeKind, Tier, Worker)
from kvbmgo import _handle, _worker
from kvbmgo._lib import ActionArray, lib

N = 200_000


def per_call_ns(fn, n=N):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def loop_ns(n=N):
    return per_call_ns(lambda: None, n)


def main():
    gc.disable()
    print(f"kvbmgo {kvbmgo.__version__}, libkvbm {kvbmgo.version()}, {kvbmgo.info().device_backend}")
    empty = loop_ns()
    raw = ctypes.CDLL(lib.path).kvbm_version  # bare: no errcheck
    raw.restype, raw.argtypes = ctypes.c_uint32, []
    bare = per_call_ns(raw) - empty
    print(f"{'empty Python call (subtracted below)':<52}{empty:8.0f} ns")
    print(f"{'kvbm_version, bare ctypes':<52}{bare:8.0f} ns/call")
    print(f"{'kvbm_version, from the table':<52}{per_call_ns(lib.kvbm_version) - empty:8.0f} ns/call")
    print(f"{'kvbmgo.version() (tuple)':<52}{per_call_ns(kvbmgo.version) - empty:8.0f} ns/call")

    cfg = LayoutConfig(num_blocks=64, num_layers=2, outer_dim=2, page_size=4, inner_dim=32,
                       dtype_width=2, layout="fully_contiguous")
    g1 = np.zeros(cfg.total_bytes // 2, np.uint16)
    with Worker(0xBE7C) as w:
        w.register_g1(cfg, g1)
        w.allocate_g2(cfg)
        n = w.transfer(Tier.G1, [0], Tier.G2, [0])
        n.wait()
        h = n.handle
        raw_poll = ctypes.CDLL(lib.path).kvbm_notification_poll
        raw_poll.restype, raw_poll.argtypes = ctypes.c_int32, [c_void_p]
        print(f"{'kvbm_notification_poll, bare ctypes':<52}{per_call_ns(lambda: raw_poll(h)) - empty:8.0f} ns/call")
        print(f"{'kvbm_notification_poll, from the table':<52}{per_call_ns(lambda: lib.kvbm_notification_poll(h)) - empty:8.0f} ns/call")
        print(f"{'Notification.poll()':<52}{per_call_ns(n.poll) - empty:8.0f} ns/call")
        n.close()

        # One transfer call (1 block G1 -> G2): time of the call only.
        M = 20_000
        ids = [3]
        ids_c = (ctypes.c_uint32 * 1)(3)
        def timed(call, free):
            # The median call: on a shared machine the mean is mostly the
            # scheduler's (a Go thread starting the copy competes for a core).
            times = []
            for i in range(M):
                t0 = time.perf_counter_ns()
                x = call()
                times.append(time.perf_counter_ns() - t0)
                free(x)
            return statistics.median(times)
        wh = w.handle
        def raw_transfer():
            out = c_void_p()
            lib.kvbm_worker_transfer(wh, 1, ids_c, 2, ids_c, 1, None, byref(out))
            return out.value
        def raw_free(v):
            lib.kvbm_notification_wait(v, -1)
            lib.kvbm_notification_free(v)
        def py_free(n):
            n.wait()
            n.close()
        t_raw = timed(raw_transfer, raw_free)
        t_py = timed(lambda: w.transfer(Tier.G1, ids, Tier.G2, ids), py_free)
        ids_np = np.array(ids, np.uint32)
        t_np = timed(lambda: w.transfer(Tier.G1, ids_np, Tier.G2, ids_np), py_free)
        print(f"{'kvbm_worker_transfer, table ctypes call (median)':<52}{t_raw / 1000:8.2f} µs/call")
        print(f"{'Worker.transfer(list ids) -> Notification':<52}{t_py / 1000:8.2f} µs/call"
              f"   overhead {(t_py - t_raw) / 1000:.2f} µs")
        print(f"{'Worker.transfer(numpy ids) -> Notification':<52}{t_np / 1000:8.2f} µs/call"
              f"   overhead {(t_np - t_raw) / 1000:.2f} µs")

        # Python's own time, without the library's: the C function replaced
        # by a stub that returns a notification handle at once, the same
        # stub called bare as the limit. Steadier than the figures above,
        # where a Go thread starting each copy competes for the cores.
        done = w.transfer(Tier.G1, ids, Tier.G2, ids)
        done.wait()
        def stub(*args):
            args[-1]._obj.value = done.handle
            return 0
        def stub_transfer():
            out = c_void_p()
            stub(wh, 1, ids_c, 2, ids_c, 1, None, byref(out))
            return out.value
        def forget(n):  # the handle is done's: drop the object without freeing it
            _handle._live.pop(n._finalizer, None)
            n._h = None
        real = _worker.lib
        _worker.lib = types.SimpleNamespace(kvbm_worker_transfer=stub)
        try:
            t_stub = timed(stub_transfer, lambda v: None)
            t_py = timed(lambda: w.transfer(Tier.G1, ids, Tier.G2, ids), forget)
            t_np = timed(lambda: w.transfer(Tier.G1, ids_np, Tier.G2, ids_np), forget)
        finally:
            _worker.lib = real
        done.close()
        print(f"{'stub in place of kvbm_worker_transfer, bare':<52}{t_stub / 1000:8.2f} µs/call")
        print(f"{'Worker.transfer(list ids) over the stub':<52}{t_py / 1000:8.2f} µs/call"
              f"   overhead {(t_py - t_stub) / 1000:.2f} µs")
        print(f"{'Worker.transfer(numpy ids) over the stub':<52}{t_np / 1000:8.2f} µs/call"
              f"   overhead {(t_np - t_stub) / 1000:.2f} µs")

    # Hand-off: a step = one start/on_fact/on_outcome call. Bare: kvbm_handoff_start
    # on a completed coordinator (no actions) vs HandoffCoordinator.start().
    hc = HandoffCoordinator(bytes(16), HandoffOrder.SOURCE_FIRST)
    hc.start()
    for a in hc.on_fact(FactKind.CANCELED):
        if a.kind != ActionKind.COMPLETE:
            hc.on_outcome(a.id, OutcomeKind.APPLIED)
    hh = hc.handle
    buf, cnt = ActionArray(), c_size_t()
    t_raw = per_call_ns(lambda: lib.kvbm_handoff_start(hh, buf, 2, byref(cnt)), 100_000) - empty
    t_py = per_call_ns(hc.start, 100_000) - empty
    print(f"{'kvbm_handoff_start, table ctypes call':<52}{t_raw / 1000:8.2f} µs/call")
    print(f"{'HandoffCoordinator.start() (no actions)':<52}{t_py / 1000:8.2f} µs/call"
          f"   overhead {(t_py - t_raw) / 1000:.2f} µs")
    hc.close()

    # A whole hand-off driven from Python, per step (actions -> Action tuples).
    def drive():
        with HandoffCoordinator(bytes(range(16)), HandoffOrder.SOURCE_FIRST, 1.0) as h:
            steps, todo = 1, list(h.start())
            while todo:
                a = todo.pop(0)
                out = {ActionKind.SUBMIT_PREFILL: OutcomeKind.SUBMITTED,
                       ActionKind.RESERVE_DESTINATION: OutcomeKind.ACCEPTED,
                       ActionKind.START_TRANSFER: OutcomeKind.SCHEDULED}.get(a.kind,
                                                                            OutcomeKind.APPLIED)
                if a.kind == ActionKind.COMPLETE:
                    continue
                todo += h.on_outcome(a.id, out)
                steps += 1
                fact = {ActionKind.SUBMIT_PREFILL: FactKind.SOURCE_HELD,
                        ActionKind.RESERVE_DESTINATION: FactKind.DESTINATION_RESERVED,
                        ActionKind.START_TRANSFER: FactKind.TRANSFER_COMPLETED}.get(a.kind)
                if fact:
                    todo += h.on_fact(fact, full_prompt_tokens=128, transferable_tokens=128)
                    steps += 1
            assert h.is_complete()
            return steps
    steps = drive()
    t = per_call_ns(drive, 5_000)
    print(f"{'full hand-off from Python (' + str(steps) + ' steps + new/free)':<52}{t / 1000:8.2f} µs"
          f"   {t / steps / 1000:.2f} µs/step")
    throughput()
    threads()
    gc.enable()
    gc.collect()
    assert kvbmgo.handle_count() == 0


def throughput():
    """Data through kvbmgo: 64 x 2 MiB blocks G1 -> G2 and back in one call
    each, beside numpy copying the same bytes in the same run."""
    cfg = LayoutConfig(num_blocks=64, num_layers=32, outer_dim=2, page_size=16, inner_dim=1024,
                       dtype_width=2, layout="fully_contiguous")
    g1 = np.ones(cfg.total_bytes // 2, dtype=np.uint16)
    other = np.zeros_like(g1)
    ids = list(range(64))
    with Worker(0xB17) as w:
        w.register_g1(cfg, g1)
        w.allocate_g2(cfg)
        for what, src, dst in (("G1 -> G2", Tier.G1, Tier.G2), ("G2 -> G1", Tier.G2, Tier.G1)):
            ours, base = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                with w.transfer(src, ids, dst, ids) as n:
                    n.wait()
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                np.copyto(other, g1)
                base.append(time.perf_counter() - t0)
            gbs = cfg.total_bytes / statistics.median(ours) / 1e9
            ref = cfg.total_bytes / statistics.median(base) / 1e9
            print(f"{'Worker.transfer ' + what + ', 64 x 2 MiB':<52}{gbs:8.2f} GB/s   "
                  f"numpy copy {ref:.2f} GB/s   {gbs / ref:.2f}x")


def threads():
    """Threads of one process, each on its own worker: 4 KiB G2 -> G1 transfer
    + wait per call (the GIL is released while waiting). Per-call time with 2
    threads beside 1: no lock shared between workers keeps it near 1x while
    there are cores for both."""
    import threading
    cfg = LayoutConfig(num_blocks=64, num_layers=1, outer_dim=1, page_size=1, inner_dim=2048,
                       dtype_width=2, layout="fully_contiguous")
    calls = 5_000

    def run(index, out):
        g1 = np.zeros(cfg.total_bytes // 2, dtype=np.uint16)
        with Worker(0xC000 + index) as w:
            w.register_g1(cfg, g1)
            w.allocate_g2(cfg)
            ids = [[i] for i in range(64)]
            t0 = time.perf_counter_ns()
            for i in range(calls):
                with w.transfer(Tier.G2, ids[i % 64], Tier.G1, ids[i % 64]) as n:
                    n.wait()
            out[index] = (time.perf_counter_ns() - t0) / calls

    one = None
    for k in (1, 2):
        out = [0.0] * k
        ts = [threading.Thread(target=run, args=(i, out)) for i in range(k)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        per = sum(out) / k
        one = one or per
        print(f"{'4 KiB transfer+wait, ' + str(k) + ' thread(s), own workers':<52}{per / 1000:8.2f} µs/call"
              f"   {per / one:.2f}x 1 thread")


if __name__ == "__main__":
    main()
