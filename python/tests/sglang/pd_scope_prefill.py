"""The prefill process of test_pd_scope.py: two rooms, A (two chunks) and B
(one), handed over through SGLang's sender; once A ended its pages get a
next owner (new bytes, as SGLang would write another request's KV there).
One JSON line per event on stdout."""
import json
import sys

from pd_harness import Side, manager, prefill_send, publish, wait_for

ROOM_A, ROOM_B = 3100, 3101
A_SRC, B_SRC = [3, 4, 5, 9, 10], [20, 21, 6]
PAGES, SEED = 32, 23
NEXT_OWNER = 0xAB  # every byte of A's pages once A ended

def say(**event):
    print(json.dumps(event), flush=True)

def main(port, model_dir):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.utils import KVClassType
    from kvbmgo.sglang.plugin import kv_class
    sa = publish(model_dir, "prefill", port)
    server = kv_class(KVClassType.BOOTSTRAP_SERVER)("127.0.0.1", port)
    side = Side(PAGES, seed=SEED)
    mgr = manager(side, "prefill", sa)
    say(event="ready")
    a = kv_class(KVClassType.SENDER)(mgr, f"127.0.0.1:{port}", ROOM_A)
    b = kv_class(KVClassType.SENDER)(mgr, f"127.0.0.1:{port}", ROOM_B)
    wait_for(a.poll, KVPoll.WaitingForInput, 120, "room A")
    wait_for(b.poll, KVPoll.WaitingForInput, 30, "room B")
    prefill_send(a, A_SRC, 1, chunks=2)
    prefill_send(b, B_SRC, 2, chunks=1)
    say(event="sent")
    state, _ = wait_for(a.poll, {KVPoll.Success, KVPoll.Failed}, 60, "room A")
    a.clear()  # what SGLang does before it frees the pages
    for i, buf in enumerate(side.kv):
        for p in A_SRC:
            side.page(i, p)[:] = NEXT_OWNER
    say(event="reused", state=int(state))
    state, _ = wait_for(b.poll, {KVPoll.Success, KVPoll.Failed}, 60, "room B")
    say(event="done B", state=int(state))
    sys.stdin.read()  # until the test closes the pipe
    mgr.close()
    server.close()

if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
