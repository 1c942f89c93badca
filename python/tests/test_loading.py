"""libkvbm.so is loaded on first use, not at import: a process that imports
kvbmgo and then forks can use the library in the child. Each case runs in a
fresh interpreter, since this one has the library loaded already."""
import subprocess
import sys
import textwrap

import pytest

from kvbmgo._lib import lib


def run(code: str, prefix: str = "", **env: str) -> str:
    """Runs prefix + code (dedented) in a new interpreter; its stdout."""
    import os
    e = dict(os.environ, KVBM_LIBRARY=lib.path)
    e.update(env)
    out = subprocess.run([sys.executable, "-c", prefix + textwrap.dedent(code)],
                         capture_output=True,
                         text=True, timeout=60, env=e)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    return out.stdout


LOADED = """
def loaded():
    with open("/proc/self/maps") as f:
        return "libkvbm" in f.read()
"""

# A child that creates a worker, registers G1, allocates G2 and moves a block
# there and back; exit status 0 when the block came back.
CHILD = """
def child():
    import numpy as np
    from kvbmgo import LayoutConfig, Tier, Worker
    cfg = LayoutConfig(num_blocks=4, num_layers=2, outer_dim=1, page_size=2, inner_dim=8,
                       dtype_width=2)
    g1 = np.arange(cfg.total_bytes // 2, dtype=np.uint16)
    want = g1.copy()
    with Worker(77) as w:
        w.register_g1(cfg, g1)
        w.allocate_g2(cfg)
        with w.transfer(Tier.G1, [1], Tier.G2, [2]) as n:
            assert n.wait(10)
        g1[:] = 0
        with w.transfer(Tier.G2, [2], Tier.G1, [1]) as n:
            assert n.wait(10)
    per_block = cfg.block_bytes // 2
    return bool((g1[per_block:2 * per_block] == want[per_block:2 * per_block]).all())
"""


def test_import_does_not_load_the_library():
    out = run(prefix=LOADED, code="""
        import kvbmgo, kvbmgo.errors
        print(loaded())
        kvbmgo.version()
        print(loaded())
    """)
    assert out.split() == ["False", "True"]


def test_import_works_without_the_library():
    """A missing library is reported at first use, as ImportError."""
    out = run("""
        import kvbmgo
        try:
            kvbmgo.Worker(1)
        except ImportError as e:
            print("ImportError", "KVBM_LIBRARY" in str(e))
    """, KVBM_LIBRARY="/nonexistent/libkvbm.so")
    assert out.split() == ["ImportError", "True"]


def test_abi_version_checked_at_first_use():
    out = run("""
        import kvbmgo
        from kvbmgo import _lib
        real = _lib.check_abi_version
        _lib.check_abi_version = lambda reported, **kw: real(reported + 1, **kw)
        for _ in range(2):  # a failed load is tried again at the next use, and fails again
            try:
                kvbmgo.version()
            except kvbmgo.AbiMismatchError as e:
                print("AbiMismatchError")
    """)
    assert out.split() == ["AbiMismatchError", "AbiMismatchError"]


def test_first_use_from_many_threads_loads_once():
    out = run("""
        import threading
        import kvbmgo
        from kvbmgo import _lib
        loads = []
        real = _lib._Lib
        class Counting(real):
            def __init__(self, path):
                loads.append(path)
                super().__init__(path)
        _lib._Lib = Counting
        go = threading.Barrier(8)
        def use():
            go.wait()
            kvbmgo.handle_count()
        ts = [threading.Thread(target=use) for _ in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        print(len(loads))
    """)
    assert out.split() == ["1"]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork()")
def test_child_forked_after_import_can_use_the_library():
    out = run(prefix=LOADED + CHILD, code="""
        import os
        import kvbmgo
        pid = os.fork()
        if pid == 0:
            try:
                ok = not loaded() and child()
            except BaseException as e:
                print("child:", repr(e), flush=True)
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), "parent loaded", loaded())
    """)
    assert out.split()[-4:] == ["0", "parent", "loaded", "False"], out


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork()")
def test_child_forked_after_first_use_gets_failed_precondition():
    out = run(prefix=CHILD, code="""
        import os
        import kvbmgo
        kvbmgo.version()  # loads the library in the parent
        pid = os.fork()
        if pid == 0:
            try:
                kvbmgo.Worker(78)
                code = 1
            except kvbmgo.FailedPreconditionError as e:
                print("child:", e, flush=True)
                code = 0 if "fork" in str(e) else 2
            except BaseException as e:
                print("child:", repr(e), flush=True)
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("exit", os.waitstatus_to_exitcode(status))
    """)
    assert out.split()[-2:] == ["exit", "0"], out
