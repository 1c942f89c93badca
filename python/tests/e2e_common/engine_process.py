"""An engine.py of a real-engine suite in its own process, driven over a
pipe (one JSON line a message each way, its stderr in a log file), and the
skip-or-fail rule for a suite whose engine is not installed."""
import json
import os
import subprocess
import sys
import tempfile

import pytest


class EngineProcess:
    """script run with cfg (JSON) as its argument; ready once it sends its
    first line. A suite's Engine builds cfg and env and adds its calls.
    With wait=False the engine loads while its maker goes on (another engine
    can load beside it); its first call waits until it is ready."""

    def __init__(self, script: str, cfg: dict, env: dict, name: str, log_name: str,
                 log_tail: int = 4000, new_session: bool = False, wait: bool = True) -> None:
        self.name, self._tail = name, log_tail
        self.log = open(os.path.join(os.environ.get("KVBM_E2E_LOGDIR", tempfile.gettempdir()),
                                     f"{log_name}-{os.getpid()}.log"), "w")
        self.p = subprocess.Popen([sys.executable, script, json.dumps(cfg)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, env=env,
                                  start_new_session=new_session)
        self._loading = True
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Returns once the engine sent its first line (at once after that)."""
        if not self._loading:
            return
        try:
            self.read()
        except BaseException:
            self.close()
            raise
        self._loading = False

    def read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            self.log.flush()
            with open(self.log.name) as f:
                tail = f.read()[-self._tail:]
            raise RuntimeError(f"engine {self.name} exited ({self.p.poll()}); its log:\n{tail}")
        return json.loads(line)

    def send(self, op: str, **kw) -> None:
        self.wait_ready()  # else read() would take the ready line for the answer
        self.p.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.p.stdin.flush()

    def call(self, op: str, **kw) -> dict:
        self.send(op, **kw)
        return self.read()

    @property
    def pid(self) -> int:
        return self.p.pid

    def close(self) -> None:
        # one still loading is killed: it would answer quit only once loaded
        if self.p.poll() is None and not self._loading:
            try:
                self.call("quit")
                self.p.wait(60)
            except Exception:  # noqa: BLE001
                pass
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.exited()
        self.log.close()

    def exited(self) -> None:
        """What a suite cleans up once the engine process is gone."""


def skip_or_require(suite: str, why, items) -> None:
    """Without its engine (why: the reason, None when it is there) a suite's
    tests skip with the reason, or fail the run when KVBM_REQUIRE_ENGINES=1
    (CI)."""
    if why is None:
        return
    if os.environ.get("KVBM_REQUIRE_ENGINES") == "1":
        raise pytest.UsageError(f"{suite}: {why} (KVBM_REQUIRE_ENGINES=1)")
    for item in items:
        item.add_marker(pytest.mark.skip(reason=why))
