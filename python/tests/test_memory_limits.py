"""Sizes the machine cannot hold are refused at once, with a message naming the
bytes requested and available (free, for G3), never the OOM killer's business.

Each runs in a child process that makes itself the OOM killer's first choice: a
regression would populate twice the machine's memory, and then the child is
killed (reported as the failure), not the test runner or a neighbour."""
import json
import os
import subprocess
import sys
import textwrap


CHILD = textwrap.dedent("""
    import json, os, sys
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    from kvbmgo import LayoutConfig, Worker, errors
    tier, size, disk = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    block = 1 << 20
    cfg = LayoutConfig(num_blocks=-(-size // block), num_layers=1, outer_dim=1, page_size=1,
                       inner_dim=block, dtype_width=1)
    with Worker(0x7e000 + os.getpid() % 4096, disk_dir=disk) as w:
        try:
            (w.allocate_g2 if tier == "g2" else w.allocate_g3)(cfg)
            print(json.dumps({"error": None}))
        except errors.KvbmError as e:
            print(json.dumps({"error": type(e).__name__, "status": e.status_name,
                              "message": e.message}))
""")


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no MemTotal")


def run_child(tier: str, size: int, disk) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, tier, str(size), str(disk)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode >= 0, (f"the child was killed by signal {-r.returncode} (the OOM "
                               f"killer?): {size} bytes were not refused before their pages "
                               f"were touched\n{r.stderr}")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_g2_twice_the_machine_is_refused_at_once(tmp_path):
    size = -(-2 * mem_total() // (1 << 20)) << 20
    out = run_child("g2", size, tmp_path)
    assert (out["error"], out["status"]) == ("CudaError", "KVBM_ERR_CUDA"), out
    assert "CUDA_ERROR_OUT_OF_MEMORY" in out["message"]
    assert f"{size} bytes requested, " in out["message"] and " available" in out["message"]


def test_a_g3_beyond_the_free_disk_is_refused(tmp_path):
    st = os.statvfs(tmp_path)
    size = ((st.f_bavail * st.f_frsize) + (1 << 40)) >> 20 << 20
    out = run_child("g3", size, tmp_path)
    assert (out["error"], out["status"]) == ("KvbmIOError", "KVBM_ERR_IO"), out
    assert f"{size} bytes requested, " in out["message"] and " free" in out["message"]
    assert os.listdir(tmp_path) == []
