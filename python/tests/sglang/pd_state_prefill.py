"""The prefill process of test_pd_state.py's two-process test: a hybrid
model's pool (KV, a Mamba pool, an SWA pool). Room A is handed over whole
(KV in two chunks, its Mamba slot and SWA window with the last); room B's
first chunk only, then the process waits to be killed. One JSON line per
event on stdout."""
import json
import sys

import numpy as np

from pd_harness import Side, manager, mamba_indices, prefill_send, publish, wait_for

KINDS = ("mamba", "swa")
ROOM_A, ROOM_B = 6200, 6201
A_SRC, A_MAMBA, A_SWA = [5, 1, 7, 3], 2, [6, 4]
B_SRC, B_MAMBA, B_SWA = [8, 9, 10, 11], 3, [1, 2]
PAGES, SEED = 20, 31


def say(**event):
    print(json.dumps(event), flush=True)


def main(port, model_dir):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.utils import KVClassType
    from kvbmgo.sglang.plugin import kv_class
    sa = publish(model_dir, "prefill", port)
    server = kv_class(KVClassType.BOOTSTRAP_SERVER)("127.0.0.1", port)  # noqa: F841
    side = Side(PAGES, seed=SEED, states=KINDS)
    mgr = manager(side, "prefill", sa)
    say(event="ready")
    a = kv_class(KVClassType.SENDER)(mgr, f"127.0.0.1:{port}", ROOM_A)
    wait_for(a.poll, KVPoll.WaitingForInput, 120, "room A")
    prefill_send(a, A_SRC, 1, state=[mamba_indices(A_MAMBA), np.array(A_SWA)])
    state, _ = wait_for(a.poll, {KVPoll.Success, KVPoll.Failed}, 60, "room A")
    say(event="done A", state=int(state))
    b = kv_class(KVClassType.SENDER)(mgr, f"127.0.0.1:{port}", ROOM_B)
    wait_for(b.poll, KVPoll.WaitingForInput, 60, "room B")
    b.init(len(B_SRC), 2)
    b.send(np.array(B_SRC[:2], np.int32), None, num_kv_tokens=2 * 4)
    say(event="B first chunk")
    sys.stdin.read()  # killed by the test meanwhile


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
