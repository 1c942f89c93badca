"""Importing kvbmgo.vllm imports neither vllm nor torch and loads no
libkvbm.so; a worker forked after the parent imported the connector class
works. Each case runs in a fresh interpreter (this one has the library
loaded already)."""
import os
import subprocess
import sys
import textwrap

from harness import require_vllm

require_vllm()

import kvbmgo  # noqa: E402
from kvbmgo._lib import lib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kvbmgo.__file__)))


def run(code: str) -> str:
    env = dict(os.environ, KVBM_LIBRARY=os.path.abspath(lib.path),
               PYTHONPATH=os.pathsep.join([HERE, PACKAGE_ROOT]))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=240, env=env, cwd=HERE)
    assert out.returncode == 0 and "Traceback" not in out.stderr, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    return out.stdout


def test_importing_the_package_imports_nothing_heavy():
    out = run("""
        import sys
        import kvbmgo.vllm
        def loaded():
            with open("/proc/self/maps") as f:
                return "libkvbm" in f.read()
        print("vllm" in sys.modules, "torch" in sys.modules, loaded())
        cls = kvbmgo.vllm.KvbmConnector          # what vLLM's factory does
        print(cls.__name__, "vllm" in sys.modules, loaded())
        import kvbmgo.vllm.config, kvbmgo.vllm.scheduler
        print(loaded())
    """)
    assert out.split() == ["False", "False", "False", "KvbmConnector", "True", "False", "False"]


def test_a_worker_forked_after_the_import_works():
    out = run("""
        import os
        import kvbmgo.vllm
        kvbmgo.vllm.KvbmConnector                 # the config process imports the class
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                from harness import BLOCK, Engine, pattern
                import torch
                e = Engine({"g2_blocks": 8})
                prompt = list(range(20, 20 + 2 * BLOCK + 1))
                e.add("A", prompt)
                e.run()
                e.settle()
                assert e.sched.reset_prefix_cache()
                e.raw.zero_()
                b = e.add("B", prompt)
                ok = []
                def check(so):
                    if "B" in so.num_scheduled_tokens and not ok:
                        ids = e.block_ids("B")
                        ok.append(all(torch.equal(e.read(ids[i], l), pattern(b.block_hashes[i], l))
                                      for i in range(2) for l in range(2)))
                e.run(before_forward=check)
                e.close()
                code = 0 if ok == [True] else 2
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert out.split()[-1:] == ["0"], out
