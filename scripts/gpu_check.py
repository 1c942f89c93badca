"""GPU half of scripts/gpu-check.sh: PyTorch-driven checks of libkvbm.so with
KVBM_DEVICE=cuda. Needs torch with CUDA and the kvbmgo package (python/).

1. Layer-wise onboard: G1 = torch tensors (data_ptr), events from
   torch.cuda.Event() (each recorded once first: torch creates the CUDA
   event lazily at its first record, so .cuda_event is 0 before, and its
   wait_event is a no-op on an event it thinks was never recorded), the
   compute stream waits on layer L's event, then reads layer L; every layer
   is checked.
2. GB/s, each beside a raw copy of one large pinned buffer measured in the
   same run: whole 2 MiB blocks (both layouts fully contiguous) and 32 KiB
   fragments (G1 layer_separate), G2->G1 (H2D) and G1->G2 (D2H).
3. Host G1 its owner pinned (cudaHostRegister, pin_memory).
4. Same host, two processes (KVBM_CUDA_IPC=1): a second process registers
   a torch tensor as G1 and exports it; this one pulls its blocks into its
   own G1 and G2 (the G1 opened with CUDA IPC, G2 mapped shared memory),
   every byte checked, each pull's GB/s printed beside the same pull with
   the same-host route off (KVBM_SAME_HOST=0: pinned staging and a socket).
"""
import os
import sys
import time

try:
    import torch
except Exception as e:  # no torch on this machine: say so plainly
    sys.exit(f"gpu_check.py needs PyTorch with CUDA: import torch failed: {type(e).__name__}: {e}")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check.py needs PyTorch with CUDA: torch {torch.__version__} sees no CUDA device")
import kvbmgo
from kvbmgo import Tier

print("kvbm info:", kvbmgo.info(), flush=True)
dev = torch.device("cuda:0")
LAYERS, BLOCKS, PAGE, HEADS, HEAD = 32, 256, 16, 8, 128  # 32 KiB per (layer, k/v); 2 MiB per block
rows = []


def raw_gbs(nbytes: int, d2h: bool) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    devb = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        (host.copy_(devb, non_blocking=True) if d2h else devb.copy_(host, non_blocking=True))
    torch.cuda.synchronize()
    s.record()
    for _ in range(10):
        (host.copy_(devb, non_blocking=True) if d2h else devb.copy_(host, non_blocking=True))
    e.record()
    e.synchronize()
    return 10 * nbytes / (s.elapsed_time(e) / 1e3) / 1e9


def raw_d2d_gbs(nbytes: int) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    b.copy_(a)
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    e.synchronize()
    return 10 * nbytes / (s.elapsed_time(e) / 1e3) / 1e9


def timed(w, src, dst, ids, reps=5) -> float:
    with w.transfer(src, ids, dst, ids) as n:  # warm-up
        n.wait()
    t0 = time.perf_counter()
    for _ in range(reps):
        with w.transfer(src, ids, dst, ids) as n:
            n.wait()
    return time.perf_counter() - t0


def layerwise() -> None:
    caches = {f"layer.{i}": torch.randn(2, BLOCKS, PAGE, HEADS, HEAD, dtype=torch.float16, device=dev)
              for i in range(LAYERS)}
    ref = {k: v.clone() for k, v in caches.items()}
    with kvbmgo.Worker(worker_id=1) as w:
        cfg, _ = w.register_kv_caches(caches)
        w.allocate_g2(cfg.replace(layout="fully_contiguous"))
        ids = list(range(0, BLOCKS, 2))
        torch.cuda.synchronize()
        with w.transfer(Tier.G1, ids, Tier.G2, ids) as n:
            n.wait()
        for v in caches.values():
            v.zero_()
        torch.cuda.synchronize()
        # torch makes an Event's CUDA event at its first record(): record each
        # once on the current stream and let that finish, so that .cuda_event
        # is a real handle and torch's wait_event really waits (it skips
        # events it never recorded). kvbm's records then replace these.
        events = [torch.cuda.Event() for _ in range(LAYERS)]
        for e in events:
            e.record()
        torch.cuda.synchronize()
        handles = [e.cuda_event for e in events]
        assert all(handles), f"torch.cuda.Event().cuda_event is 0 after record(): {handles}"
        compute = torch.cuda.Stream()
        # onboard_layerwise has recorded every layer's event when it returns,
        # so the waits below wait for kvbm's copies.
        n = w.onboard_layerwise(ids, ids, handles)
        sums = []
        with torch.cuda.stream(compute):
            for L, (k, v) in enumerate(caches.items()):
                compute.wait_event(events[L])  # attention of layer L waits for its KV
                sums.append((v[:, ids] - ref[k][:, ids]).abs().sum())
        with n:
            n.wait()
        compute.synchronize()
        bad = [L for L, s in enumerate(sums) if s.item() != 0]
        print(f"layerwise onboard: {LAYERS} layers, {len(ids)} blocks, mismatched layers {bad}", flush=True)
        assert not bad, bad

        # 32 KiB fragments: G1 layer_separate <-> G2 fully_contiguous.
        nbytes = len(ids) * LAYERS * 2 * PAGE * HEADS * HEAD * 2
        for name, src, dst, d2h in (("H2D 32KiB frags", Tier.G2, Tier.G1, False),
                                    ("D2H 32KiB frags", Tier.G1, Tier.G2, True)):
            t = timed(w, src, dst, ids)
            rows.append((name, 5 * nbytes / t / 1e9, raw_gbs(1 << 30, d2h)))


def blocks() -> None:
    shape = (BLOCKS, LAYERS, 2, PAGE, HEADS, HEAD)
    g1 = torch.randn(*shape, dtype=torch.float16, device=dev)
    with kvbmgo.Worker(worker_id=2) as w:
        cfg, _ = w.register_kv_caches([g1], layout="fully_contiguous")
        w.allocate_g2(cfg)
        ids = list(range(BLOCKS // 2))
        nbytes = len(ids) * LAYERS * 2 * PAGE * HEADS * HEAD * 2
        for name, src, dst, d2h in (("H2D 2MiB blocks", Tier.G2, Tier.G1, False),
                                    ("D2H 2MiB blocks", Tier.G1, Tier.G2, True)):
            t = timed(w, src, dst, ids)
            rows.append((name, 5 * nbytes / t / 1e9, raw_gbs(1 << 30, d2h)))
    rows.append(("D2D raw only (1 GiB)", float("nan"), raw_d2d_gbs(1 << 30)))


def pinned_host_g1() -> None:
    """G1 over host memory its owner pinned with CUDA, as SGLang's HiCache
    host pool is (cudaHostRegister), and as torch's pin_memory does
    (cudaHostAlloc): register_g1_host uses it as it is; G1 -> G2 -> G1 keeps
    every byte."""
    cfg = kvbmgo.LayoutConfig(num_blocks=8, num_layers=4, outer_dim=2, page_size=16,
                              inner_dim=1024, dtype_width=2, layout="fully_contiguous")
    for how in ("cudaHostRegister", "pin_memory"):
        if how == "pin_memory":
            pool = torch.empty(cfg.total_bytes // 2, dtype=torch.float16, pin_memory=True)
        else:
            pool = torch.empty(cfg.total_bytes // 2, dtype=torch.float16)
            rc = torch.cuda.cudart().cudaHostRegister(pool.data_ptr(), cfg.total_bytes, 0)
            assert int(rc) == 0, f"cudaHostRegister: {rc}"
        pool.copy_(torch.randn(pool.numel(), dtype=torch.float16))
        want = pool.clone()
        with kvbmgo.Worker(worker_id=3) as w:
            w.register_g1_host(cfg, pool)
            w.allocate_g2(cfg)
            ids = list(range(8))
            with w.transfer(Tier.G1, ids, Tier.G2, ids) as n:
                n.wait()
            pool.zero_()
            with w.transfer(Tier.G2, ids, Tier.G1, ids) as n:
                n.wait()
            assert torch.equal(pool, want), f"pinned host G1 ({how}) round trip lost bytes"
        if how == "cudaHostRegister":
            torch.cuda.cudart().cudaHostUnregister(pool.data_ptr())
        print(f"pinned host G1 ({how} by its owner): round trip ok", flush=True)


IPC_BLOCKS = 64


def ipc_exporter() -> None:
    """The second process of same_host_ipc: G1 holds block b's pattern
    (b + 1 in every fp16 element); prints metadata and handles, then waits
    until stdin closes."""
    import json
    shape = (IPC_BLOCKS, LAYERS, 2, PAGE, HEADS, HEAD)
    g1 = torch.empty(*shape, dtype=torch.float16, device=dev)
    for b in range(IPC_BLOCKS):
        g1[b].fill_(b + 1)
    torch.cuda.synchronize()
    with kvbmgo.Worker(worker_id=0x1C) as w:
        cfg, h1 = w.register_kv_caches([g1], layout="fully_contiguous")
        h2 = w.allocate_g2(cfg)
        with w.transfer(Tier.G1, list(range(IPC_BLOCKS)), Tier.G2, list(range(IPC_BLOCKS))) as n:
            n.wait()
        print("ready " + json.dumps({"metadata": w.export_metadata().hex(), "g1": list(h1), "g2": list(h2)}), flush=True)
        sys.stdin.read()


def same_host_ipc() -> None:
    import json
    import subprocess
    from kvbmgo import LayoutHandle
    shape = (IPC_BLOCKS, LAYERS, 2, PAGE, HEADS, HEAD)
    nbytes = IPC_BLOCKS * LAYERS * 2 * PAGE * HEADS * HEAD * 2
    for route in ("same host", "socket"):
        env = dict(os.environ, KVBM_CUDA_IPC="1", KVBM_SAME_HOST="1" if route == "same host" else "0")
        child = subprocess.Popen([sys.executable, __file__, "--ipc-exporter"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)
        try:
            line = child.stdout.readline()
            while line and not line.startswith("ready "):
                line = child.stdout.readline()
            assert line, f"the exporter process exited ({child.wait()})"
            info = json.loads(line[len("ready "):])
            g1 = torch.zeros(*shape, dtype=torch.float16, device=dev)
            with kvbmgo.Worker(worker_id=0x2C) as w:
                cfg, _ = w.register_kv_caches([g1], layout="fully_contiguous")
                w.allocate_g2(cfg)
                w.connect_remote(1, bytes.fromhex(info["metadata"]))
                ids = list(range(IPC_BLOCKS))
                for tier, remote in ((Tier.G1, LayoutHandle(*info["g1"])), (Tier.G1, LayoutHandle(*info["g2"])),
                                     (Tier.G2, LayoutHandle(*info["g1"]))):
                    g1.zero_()
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    with w.transfer_from_remote(remote, ids, tier, ids) as n:
                        n.wait()
                    took = time.perf_counter() - start
                    if tier == Tier.G2:
                        with w.transfer(Tier.G2, ids, Tier.G1, ids) as n:
                            n.wait()
                    torch.cuda.synchronize()
                    for b in range(IPC_BLOCKS):
                        assert bool((g1[b] == b + 1).all()), f"{route}: block {b} pulled from {remote} is wrong"
                    name = f"{route}: {'G2' if remote == LayoutHandle(*info['g2']) else 'G1'}->{'G1' if tier == Tier.G1 else 'G2'}"
                    rows.append((name, nbytes / took / 1e9, float("nan")))
        finally:
            child.stdin.close()
            child.wait(30)
    print("same host (CUDA IPC) and socket pulls: every byte ok", flush=True)


if len(sys.argv) > 1 and sys.argv[1] == "--ipc-exporter":
    ipc_exporter()
    sys.exit(0)

status = 0
for step in (layerwise, blocks, pinned_host_g1, same_host_ipc):
    try:
        step()
    except Exception as e:  # report and go on to the next step
        print(f"FAIL {step.__name__}: {type(e).__name__}: {e}", flush=True)
        status = 1
print(f"{'copy':24} {'kvbm GB/s':>10} {'raw GB/s':>10}")
for name, k, r in rows:
    print(f"{name:24} {k:10.1f} {r:10.1f}")
sys.exit(status)
