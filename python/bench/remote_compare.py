#!/usr/bin/env python3
"""kvbm's data plane between two processes beside NIXL and Mooncake
(`make bench-remote-compare`).

Each system moves the same bytes between two processes on this host, host
memory (and kvbm alone device memory too, below): 256 whole blocks of 2 MiB and 2,048 fragments of 32 KiB (32
blocks of 64 fragments: 32 layers x K,V), pull (READ: the initiator reads
the peer's memory) and push (WRITE). The peer ("server") is a second
process this one starts; each system gets its own pair of processes, so that
one that crashes or hangs takes nothing else down.

- kvbm over its TCP transport (KVBM_TRANSPORT=tcp), through kvbmgo, by
  both routes: same host (the default between two processes of one host: a
  Unix socket, and the server's G2 mapped by the initiator, which copies
  it itself, and its G1 copied by the initiator with process_vm_readv/
  writev) and TCP (the server started with KVBM_SAME_HOST=0). Whole
  blocks are G2 (pinned, fully contiguous) to G2; fragments come from or go
  to the server's G1, host memory (register_g1_host, as an engine whose KV
  lives in host memory registers it, and as the others register theirs
  here) registered layer-separate with the block as the second
  dimension ([K|V][block][page][inner] per layer, vLLM's FlashAttention
  shape) and only every other block moved, so each block is 64 separate,
  non-adjacent 32 KiB pieces there (one contiguous 2 MiB G2 block here).
  kvbm alone also moves the same fragments from and to a G1 of the same
  shape in device memory (the emulated device here: its copy engine is a
  memcpy on one of these CPUs, which a GPU's is not), registered by a
  second worker of the server: the "G1 dev" rows.
- kvbm over its UCX transport (KVBM_TRANSPORT=ucx), on the UCX transports
  NIXL runs on below (UCX_TLS=sm, UCX_TLS=tcp), with Debian's UCX 1.13
  and with NIXL's generation of it, 1.22 (scripts/ucx-current.sh): its
  message mode (the default: the exporter answers each read, whose bytes
  kvbm copies in from UCX's receive memory; it pulls only, so its push
  rows say so), and its
  one-sided mode (KVBM_UCX_ONE_SIDED=1, accepted with
  KVBM_UCX_ACCEPT_LATE_WRITES=1 for the figures: reads and writes in
  place).
- NIXL (nixl-cu12), UCX backend, DRAM registrations, over shared memory
  (UCX_TLS=sm; ucx_error_handling_mode=none, without which NIXL 1.5.1 cannot
  create the UCX endpoint there; UCX then reads and writes with CMA, one
  kernel copy) and over TCP (UCX_TLS=tcp; UCX writes zero-copy over lo and
  eth0, and emulates READ with active messages), one descriptor per block
  or per fragment, at the same offsets as kvbm's layouts.
- Mooncake's transfer engine, TCP protocol, P2P handshake (no metadata
  server), the same descriptors through batch_transfer_sync_read/write.

Each figure is printed beside two limits measured in the same run, on the
same number of bytes, interleaved with it: a plain TCP stream between the
same two processes (one connection, TCP_NODELAY, header then the bytes) and
an in-process copy (numpy) in the initiator. Timings include each
system's per-call work (kvbm: the transfer call and its wait; NIXL:
initialize_xfer, transfer, polling, release; Mooncake: the batch call).
Figures are medians of --runs runs (default 3) after one warm-up run;
with --rounds R every system runs R times, round after round (each in new
processes), and the figures are the medians of its R rounds, so that two
systems' figures span the same stretch of time on a noisy machine. kvbm's
UCX message mode is then also printed over NIXL on the same UCX
transport, pull by pull: the median of the rounds' ratios, and each.

A system whose package is missing or cannot run here gets one line with the
reason; the script fails only when kvbm itself (or the limits) cannot run.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # kvbmgo from this checkout

MiB = 1 << 20
BLOCK = 2 * MiB
FRAG = 32 * 1024
LAYERS, OUTER, PAGE, INNER, WIDTH = 32, 2, 16, 1024, 2  # 32 x 2 x 32 KiB = 2 MiB
WHOLE_BLOCKS = 256
FRAG_BLOCKS = 32  # x 64 fragments = 2,048
FRAG_REGION_BLOCKS = 2 * FRAG_BLOCKS  # every other block of the layer-separate region
assert LAYERS * OUTER * PAGE * INNER * WIDTH == BLOCK and PAGE * INNER * WIDTH == FRAG

CASES = [  # (name, push, what: whole blocks, fragments, fragments of device memory)
    ("pull 256 x 2 MiB", False, "whole"),
    ("push 256 x 2 MiB", True, "whole"),
    ("pull 2048 x 32 KiB", False, "frag"),
    ("push 2048 x 32 KiB", True, "frag"),
    ("pull 2048 x 32 KiB G1 dev", False, "dev"),
    ("push 2048 x 32 KiB G1 dev", True, "dev"),
]


def case_bytes(what):
    return WHOLE_BLOCKS * BLOCK if what == "whole" else FRAG_BLOCKS * BLOCK


def not_run(push, what, pushes):
    """Why a system gave no figure for a case (pushes: whether it pushed
    host memory)."""
    if push and not pushes:
        return "refused: pulls only (the receiver pulls)"
    return "not run: no device memory here" if what == "dev" else "not run"


def addr(a):
    return a.__array_interface__["data"][0]


def filled(nbytes, value):
    a = np.empty(nbytes, dtype=np.uint8)
    a.fill(value)  # faults every page in
    return a


# ---- descriptors shared by NIXL and Mooncake: the same offsets as kvbm's layouts

def whole_pairs(local, remote):
    """(local address, remote address, length) per 2 MiB block."""
    return [(local + i * BLOCK, remote + i * BLOCK, BLOCK) for i in range(WHOLE_BLOCKS)]


def frag_pairs(local, remote):
    """Per 32 KiB fragment: local block k fully contiguous ([layer][K|V]);
    remote block 2k of a layer-separate region, block second:
    remote + layer*(2 x 64 blocks x 32 KiB) + outer*(64 blocks x 32 KiB) + block*32 KiB."""
    layer_bytes = OUTER * FRAG_REGION_BLOCKS * FRAG
    out = []
    for k in range(FRAG_BLOCKS):
        for layer in range(LAYERS):
            for o in range(OUTER):
                lo = local + k * BLOCK + (layer * OUTER + o) * FRAG
                ro = remote + layer * layer_bytes + o * FRAG_REGION_BLOCKS * FRAG + 2 * k * FRAG
                out.append((lo, ro, FRAG))
    return out


FRAG_REGION_BYTES = LAYERS * OUTER * FRAG_REGION_BLOCKS * FRAG


# ---- the plain TCP stream (the limit): 'r' n -> the server writes n bytes;
# 'w' n -> it reads n bytes, then answers one byte.

def raw_server(ln, mem):
    view = memoryview(mem)
    while True:
        try:
            c, _ = ln.accept()
        except OSError:
            return
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def serve(c=c):
            with c:
                while True:
                    head = recv_exact(c, bytearray(9))
                    if head is None:
                        return
                    n = min(struct.unpack_from("<Q", head, 1)[0], len(mem))
                    if head[0] == ord("r"):
                        c.sendall(view[:n])
                    else:
                        if recv_exact(c, view[:n]) is None:
                            return
                        c.sendall(b"k")
        threading.Thread(target=serve, daemon=True).start()


def recv_exact(c, buf):
    view = memoryview(buf).cast("B")
    got = 0
    while got < len(view):
        n = c.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return buf


def raw_stream(c, buf, n, push):
    start = time.perf_counter()
    c.sendall(struct.pack("<cQ", b"w" if push else b"r", n))
    view = memoryview(buf)[:n]
    if push:
        c.sendall(view)
        recv_exact(c, bytearray(1))
    else:
        recv_exact(c, view)
    return time.perf_counter() - start


# ---- the systems. Each has serve() (in the server: returns what the
# initiator needs, JSON) and connect(info) (in the initiator: returns a
# function (push, what) -> seconds, or None for a case it does not do).

class Kvbm:
    SERVER, CLIENT, INSTANCE = 0xB1, 0xDEC, 1
    DEVICE_SERVER, DEVICE_INSTANCE = 0xB2, 2  # the server's worker whose G1 is device memory

    transport = "tcp"

    def __init__(self, same_host):
        # The server's env decides the route: without its same-host socket
        # in the endpoint the initiator can only dial TCP.
        self.env = {"KVBM_TRANSPORT": "tcp", "KVBM_TCP_LISTEN": "127.0.0.1:0",
                    "KVBM_SAME_HOST": "1" if same_host else "0"}

    @staticmethod
    def config(blocks, **kw):
        from kvbmgo import LayoutConfig
        return LayoutConfig(num_blocks=blocks, num_layers=LAYERS, outer_dim=OUTER, page_size=PAGE,
                            inner_dim=INNER, dtype_width=WIDTH, **kw)

    def serve(self):
        import kvbmgo
        from kvbmgo import Worker
        if kvbmgo.info().transport != self.transport:
            raise RuntimeError(f"kvbm transport is {kvbmgo.info().transport!r}, not {self.transport}")
        self.w = Worker(self.SERVER)
        cfg = self.config(FRAG_REGION_BLOCKS, layout="layer_separate", block_dim="second")
        self.g1 = [np.ones(cfg.layer_bytes // WIDTH, dtype=np.uint16) for _ in range(LAYERS)]
        g1 = self.w.register_g1_host(cfg, self.g1)
        g2 = self.w.allocate_g2(self.config(WHOLE_BLOCKS))
        info = {"metadata": self.w.export_metadata().hex(), "g1": list(g1), "g2": list(g2)}
        if kvbmgo.info().device_backend == "emulated":  # the cuda backend's G1 takes CUDA tensors
            self.dev = Worker(self.DEVICE_SERVER)
            self.g1_dev = [np.ones(cfg.layer_bytes // WIDTH, dtype=np.uint16) for _ in range(LAYERS)]
            dev = self.dev.register_g1(cfg, self.g1_dev)  # device memory: the emulated device's
            info.update(dev_metadata=self.dev.export_metadata().hex(), dev=list(dev))
        return info

    def connect(self, info):
        from kvbmgo import LayoutHandle, Tier, Worker
        w = self.w = Worker(self.CLIENT)
        w.allocate_g2(self.config(WHOLE_BLOCKS))
        w.connect_remote(self.INSTANCE, bytes.fromhex(info["metadata"]))
        whole = list(range(WHOLE_BLOCKS))
        local_frag = list(range(FRAG_BLOCKS))
        remote_frag = list(range(0, FRAG_REGION_BLOCKS, 2))
        cases = {"whole": (LayoutHandle(*info["g2"]), whole, whole),
                 "frag": (LayoutHandle(*info["g1"]), remote_frag, local_frag)}
        if "dev" in info:
            w.connect_remote(self.DEVICE_INSTANCE, bytes.fromhex(info["dev_metadata"]))
            cases["dev"] = (LayoutHandle(*info["dev"]), remote_frag, local_frag)

        def run(push, what):
            if what not in cases:
                return None
            remote, rids, lids = cases[what]
            start = time.perf_counter()
            if push:
                n = w.transfer_to_remote(Tier.G2, lids, remote, rids)
            else:
                n = w.transfer_from_remote(remote, rids, Tier.G2, lids)
            with n:
                n.wait()
            return time.perf_counter() - start
        return run


class KvbmUcx(Kvbm):
    """kvbm over its UCX transport, on the UCX transports NIXL runs on, with
    the libucp NIXL's own wheel does not bring: Debian's (the default) or
    another named by KVBM_UCX_LIB (make bench-remote-compare passes the
    current one of scripts/ucx-current.sh as KVBM_BENCH_UCX_LIB)."""
    transport = "ucx"

    def __init__(self, tls, lib=None, one_sided=False):
        self.one_sided = one_sided
        self.env = {"KVBM_TRANSPORT": "ucx", "UCX_TLS": tls}
        if one_sided:
            self.env.update(KVBM_UCX_ONE_SIDED="1", KVBM_UCX_ACCEPT_LATE_WRITES="1")
        if lib:
            self.env["KVBM_UCX_LIB"] = lib

    def connect(self, info):
        run = super().connect(info)
        if self.one_sided:
            return run
        # The message mode pulls only: no push row.
        return lambda push, what: None if push else run(push, what)


def _current_ucx():
    return os.environ.get("KVBM_BENCH_UCX_LIB") or None


class Nixl:
    def __init__(self, tls):
        self.tls = tls
        # shm: NIXL 1.5.1's UCX backend fails over shared memory unless its
        # endpoints skip UCX's peer error handling.
        self.params = {"ucx_error_handling_mode": "none"} if tls == "sm" else {}
        self.env = {"UCX_TLS": tls}

    def agent(self, name):
        try:
            from nixl_cu12._api import nixl_agent, nixl_agent_config
        except ImportError:
            from nixl._api import nixl_agent, nixl_agent_config
        a = nixl_agent(name, nixl_agent_config(backends=[]))
        if "UCX" not in a.get_plugin_list():
            raise RuntimeError(f"no UCX plugin (plugins: {a.get_plugin_list()})")
        a.create_backend("UCX", self.params)
        return a

    def serve(self):
        self.a = self.agent("server")
        self.whole = filled(WHOLE_BLOCKS * BLOCK, 7)
        self.frag = filled(FRAG_REGION_BYTES, 9)
        self.a.register_memory([(addr(self.whole), self.whole.nbytes, 0, ""),
                                (addr(self.frag), self.frag.nbytes, 0, "")], "DRAM")
        return {"metadata": self.a.get_agent_metadata().hex(),
                "whole": addr(self.whole), "frag": addr(self.frag)}

    def connect(self, info):
        a = self.a = self.agent("client")
        self.local = filled(WHOLE_BLOCKS * BLOCK, 1)
        a.register_memory([(addr(self.local), self.local.nbytes, 0, "")], "DRAM")
        peer = a.add_remote_agent(bytes.fromhex(info["metadata"]))
        lists = {}
        for what, pairs in (("whole", whole_pairs(addr(self.local), info["whole"])),
                            ("frag", frag_pairs(addr(self.local), info["frag"]))):
            arr = np.array(pairs, dtype=np.uint64)
            loc = np.stack([arr[:, 0], arr[:, 2], np.zeros_like(arr[:, 0])], axis=1)
            rem = np.stack([arr[:, 1], arr[:, 2], np.zeros_like(arr[:, 0])], axis=1)
            lists[what] = (a.get_xfer_descs(loc, "DRAM"), a.get_xfer_descs(rem, "DRAM"))

        def run(push, what):
            if what not in lists:
                return None
            loc, rem = lists[what]
            start = time.perf_counter()
            h = a.initialize_xfer("WRITE" if push else "READ", loc, rem, peer)
            state = a.transfer(h)
            while state == "PROC":
                state = a.check_xfer_state(h)
            a.release_xfer_handle(h)
            if state != "DONE":
                raise RuntimeError(f"NIXL transfer state {state}")
            return time.perf_counter() - start

        run(False, "whole")  # a check that bytes moved: the server's whole region is 7s
        if self.local[0] != 7 or self.local[-1] != 7:
            raise RuntimeError("NIXL READ completed but the bytes did not arrive")
        return run


class Mooncake:
    env = {}

    def engine(self):
        from mooncake.engine import TransferEngine
        e = TransferEngine()
        if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("TransferEngine.initialize(127.0.0.1, P2PHANDSHAKE, tcp) failed")
        return e

    def register(self, a):
        if self.e.register_memory(addr(a), a.nbytes) != 0:
            raise RuntimeError("register_memory failed")

    def serve(self):
        self.e = self.engine()
        self.whole = filled(WHOLE_BLOCKS * BLOCK, 7)
        self.frag = filled(FRAG_REGION_BYTES, 9)
        self.register(self.whole)
        self.register(self.frag)
        return {"session": f"127.0.0.1:{self.e.get_rpc_port()}",
                "whole": addr(self.whole), "frag": addr(self.frag)}

    def connect(self, info):
        self.e = self.engine()
        self.local = filled(WHOLE_BLOCKS * BLOCK, 1)
        self.register(self.local)
        session = info["session"]
        lists = {w: [list(x) for x in zip(*pairs)] for w, pairs in
                 (("whole", whole_pairs(addr(self.local), info["whole"])),
                  ("frag", frag_pairs(addr(self.local), info["frag"])))}

        def run(push, what):
            if what not in lists:
                return None
            loc, rem, lengths = lists[what]
            start = time.perf_counter()
            if push:
                ret = self.e.batch_transfer_sync_write(session, loc, rem, lengths)
            else:
                ret = self.e.batch_transfer_sync_read(session, loc, rem, lengths)
            if ret != 0:
                raise RuntimeError(f"Mooncake batch transfer returned {ret}")
            return time.perf_counter() - start

        run(False, "whole")
        if self.local[0] != 7 or self.local[-1] != 7:
            raise RuntimeError("Mooncake read completed but the bytes did not arrive")
        return run


SYSTEMS = {
    "kvbm-same-host": ("kvbm, same host", lambda: Kvbm(True)),
    "kvbm-tcp": ("kvbm, TCP", lambda: Kvbm(False)),
    "kvbm-ucx-shm": ("kvbm, UCX shared memory", lambda: KvbmUcx("sm")),
    "kvbm-ucx-tcp": ("kvbm, UCX TCP", lambda: KvbmUcx("tcp")),
    "kvbm-ucx122-shm": ("kvbm, UCX 1.22 shared memory", lambda: KvbmUcx("sm", _current_ucx())),
    "kvbm-ucx122-tcp": ("kvbm, UCX 1.22 TCP", lambda: KvbmUcx("tcp", _current_ucx())),
    "kvbm-ucx1s-shm": ("kvbm, UCX shm, one-sided", lambda: KvbmUcx("sm", one_sided=True)),
    "kvbm-ucx1s-tcp": ("kvbm, UCX TCP, one-sided", lambda: KvbmUcx("tcp", one_sided=True)),
    "nixl-ucx-shm": ("NIXL{v}, UCX shared memory", lambda: Nixl("sm")),
    "nixl-ucx-tcp": ("NIXL{v}, UCX TCP", lambda: Nixl("tcp")),
    "mooncake-tcp": ("Mooncake TE{v}, TCP", Mooncake),
}


def system_env(name):
    s = SYSTEMS[name][1]()
    return dict(os.environ, **s.env)


# ---- the two roles

def server(name):
    s = SYSTEMS[name][1]()
    info = s.serve()
    raw = filled(WHOLE_BLOCKS * BLOCK, 3)
    ln = socket.socket()
    ln.bind(("127.0.0.1", 0))
    ln.listen()
    threading.Thread(target=raw_server, args=(ln, raw), daemon=True).start()
    info["raw"] = ln.getsockname()[1]
    print("ready " + json.dumps(info), flush=True)
    sys.stdin.read()  # until the initiator closes stdin or exits
    os._exit(0)  # see client()


def client(name, runs):
    proc = subprocess.Popen([sys.executable, __file__, "--server", name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=system_env(name))
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("ready "):  # NIXL logs to stdout
            sys.stderr.write(line)
            line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            raise RuntimeError(f"the server process exited ({proc.returncode}) before it was ready")
        info = json.loads(line[len("ready "):])
        threading.Thread(target=lambda: [sys.stderr.write(ln) for ln in proc.stdout],
                         daemon=True).start()  # its logs never fill the pipe
        run = SYSTEMS[name][1]().connect(info)
        conn = socket.create_connection(("127.0.0.1", info["raw"]))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = filled(WHOLE_BLOCKS * BLOCK, 4)
        src = filled(WHOLE_BLOCKS * BLOCK, 5)
        times = {c[0]: {"sys": [], "stream": [], "memcpy": []} for c in CASES}
        for i in range(runs + 1):  # the first is the warm-up
            for cname, push, what in CASES:
                n = case_bytes(what)
                t_sys = run(push, what)
                if t_sys is None:  # the system does not do this case
                    times[cname]["sys"] = None
                    continue
                t_stream = raw_stream(conn, stream, n, push)
                start = time.perf_counter()
                np.copyto(stream[:n], src[:n])
                t_copy = time.perf_counter() - start
                if i:
                    for k, t in (("sys", t_sys), ("stream", t_stream), ("memcpy", t_copy)):
                        times[cname][k].append(n / t / 1e9)
        out = {c: {k: statistics.median(v) if v is not None else None for k, v in d.items()}
               if d["sys"] is not None else None for c, d in times.items()}
        print("result " + json.dumps(out), flush=True)
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # Skip the exit handlers: the libnl-route that NIXL 1.5.1's wheel bundles
    # for UCX dies of SIGSEGV in its destructor (rtnl_tc_unregister) at
    # every exit once UCX is loaded, after the figures are out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


PACKAGES = {"nixl": ("nixl-cu12", "nixl_cu12"),
            "mooncake": ("mooncake-transfer-engine-non-cuda", "mooncake.engine")}


def package_of(name):
    return PACKAGES.get(name.split("-")[0])


def version_of(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def label(name):
    pkg = package_of(name)
    v = version_of(pkg[0]) if pkg else None
    return SYSTEMS[name][0].format(v=f" {v}" if v else "")


def why(name):
    """The reason a system cannot run here, or None. Looked up, not
    imported: the initiator's process finds out whether it loads."""
    if name.startswith("kvbm-ucx122") and not _current_ucx():
        return "no current UCX named (KVBM_BENCH_UCX_LIB; make bench-remote-compare sets it)"
    pkg = package_of(name)
    if pkg is None:
        return None
    dist, module = pkg
    if version_of(dist) is None or importlib.util.find_spec(module.split(".")[0]) is None:
        return missing_note(dist) or f"{dist} is not installed in {sys.prefix}"
    return None


def missing_note(package):
    """Why the venv script could not install package, if it wrote that down."""
    f = Path(sys.prefix) / ".kvbm-missing"
    if f.exists():
        for line in f.read_text().splitlines():
            if line.startswith(package + ":"):
                return line.split(":", 1)[1].strip()
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1,
                   help="every system this many times, round after round; figures are the rounds' medians")
    p.add_argument("--only", default=",".join(SYSTEMS), help="comma-separated: " + ", ".join(SYSTEMS))
    p.add_argument("--timeout", type=float, default=240, help="seconds per system")
    p.add_argument("--server", help=argparse.SUPPRESS)
    p.add_argument("--client", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.server:
        return server(a.server)
    if a.client:
        return client(a.client, a.runs)

    names = [n for n in a.only.split(",") if n]
    for n in names:
        if n not in SYSTEMS:
            p.error(f"unknown system {n!r} (known: {', '.join(SYSTEMS)})")
    load = os.getloadavg()
    rounds = f" in each of {a.rounds} rounds (every system once a round), then the rounds' median" if a.rounds > 1 else ""
    print(f"two processes on this host, host memory (kvbm's G1 dev rows: device memory); medians of {a.runs} runs{rounds}; "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    print("each figure GB/s, beside a plain TCP stream (stream) and an in-process copy (memcpy) "
          "of the same bytes in the same run\n")
    head = f"{'system':<32} {'case':<25} {'GB/s':>7} {'stream':>7} {'x stream':>9} {'memcpy':>7} {'x memcpy':>9}"
    rows, notes, failed = [head, "-" * len(head)], [], False
    # results[name]: one dict per round, case -> medians (None: refused);
    # skip[name]: why the system gives no figures here.
    results, skip, took = {n: [] for n in names}, {}, {n: 0.0 for n in names}
    for n in names:
        reason = why(n)
        if reason:
            skip[n] = f"skipped: {reason}"
    # Round after round, every system once a round: each system's figures
    # are taken across the same stretch of time as the others', so that a
    # ratio between two systems is not the machine's drift between their
    # turns.
    for _ in range(a.rounds):
        for n in names:
            if n in skip:
                continue
            start = time.monotonic()
            try:
                r = subprocess.run([sys.executable, __file__, "--client", n, "--runs", str(a.runs)],
                                   capture_output=True, text=True, timeout=a.timeout, env=system_env(n))
                res = [ln for ln in r.stdout.splitlines() if ln.startswith("result ")]
                if r.returncode != 0 or not res:
                    err = [ln for ln in r.stderr.splitlines() if ln.strip()] or \
                        [ln for ln in r.stdout.splitlines() if ln.strip()]
                    raise RuntimeError(f"exit status {r.returncode}: " + (err[-1][:300] if err else "no output"))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                msg = f"did not finish in {a.timeout:.0f} s" if isinstance(e, subprocess.TimeoutExpired) else str(e)
                skip[n] = f"cannot run here: {msg}"
                failed |= n == "kvbm-tcp"
                continue
            finally:
                took[n] += time.monotonic() - start
            results[n].append(json.loads(res[-1][len("result "):]))
    for n in names:
        lab = label(n)
        if n in skip:
            rows.append(f"{lab:<32} {skip[n]}")
            continue
        for cname, push, what in CASES:
            per = [r[cname] for r in results[n]]
            if per[0] is None:
                pushes = any(results[n][0][c] is not None for c, p, w in CASES if p and w != "dev")
                rows.append(f"{lab:<32} {cname:<25} {not_run(push, what, pushes)}")
                continue
            m = {k: statistics.median(x[k] for x in per) for k in ("sys", "stream", "memcpy")}
            rows.append(f"{lab:<32} {cname:<25} {m['sys']:7.2f} {m['stream']:7.2f} "
                        f"{m['sys'] / m['stream']:9.2f} {m['memcpy']:7.2f} {m['sys'] / m['memcpy']:9.2f}")
        notes.append(f"{lab}: {took[n]:.0f} s")
    load = os.getloadavg()
    print("\n".join(rows))
    versus = head_to_head(names, results, skip)
    if versus:
        print(f"\nkvbm's UCX message mode over NIXL on the same UCX transport, the pulls both do: "
              f"the median of the {a.rounds} rounds' ratios (each round's)")
        print("\n".join(versus))
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at end; " + ", ".join(notes))
    return 1 if failed else 0


# kvbm's message-mode rows and the NIXL row on the same UCX transport.
VERSUS = [("kvbm-ucx-shm", "nixl-ucx-shm"), ("kvbm-ucx122-shm", "nixl-ucx-shm"),
          ("kvbm-ucx-tcp", "nixl-ucx-tcp"), ("kvbm-ucx122-tcp", "nixl-ucx-tcp")]


def head_to_head(names, results, skip):
    """One line per pull case of each pair in VERSUS that ran: kvbm's GB/s
    over NIXL's, round by round, and their median."""
    out = []
    for k, x in VERSUS:
        if k not in names or x not in names or k in skip or x in skip:
            continue
        for cname, push, _ in CASES:
            if push:
                continue
            ratios = [rk[cname]["sys"] / rx[cname]["sys"] for rk, rx in zip(results[k], results[x])
                      if rk[cname] is not None and rx[cname] is not None]
            if ratios:
                each = " ".join(f"{r:.2f}" for r in ratios)
                out.append(f"{label(k):<32} {cname:<25} {statistics.median(ratios):5.2f}x  ({each})")
    return out


if __name__ == "__main__":
    sys.exit(main() or 0)
