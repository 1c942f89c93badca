"""The prefill instance of the two-process P/D test, run as its own
process: python prefill_process.py PORT. Prints one JSON line when its
request is prefilled (the kv_transfer_params and the hex bytes of each of
its blocks, every layer), steps until the decode instance let go of it,
then prints a second line (what finished_sending reported) and exits."""
import json
import sys
import time

from harness import LAYERS, Engine, require_vllm

require_vllm()


def main() -> None:
    port = int(sys.argv[1])
    prompt = json.loads(sys.argv[2])
    p = Engine({"g2_blocks": 8, "pd_port": port}, role="kv_producer",
               engine_id="prefill-process")
    try:
        p.add("R", prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        while "R" not in p.finished:
            p.step()
        params = p.finished["R"].kv_transfer_params
        blocks = [[p.read(b, layer).numpy().tobytes().hex() for layer in range(len(LAYERS))]
                  for b in params["remote_block_ids"]]
        print(json.dumps({"params": params, "blocks": blocks}), flush=True)
        deadline = time.monotonic() + 60
        while p.sched.has_requests() and time.monotonic() < deadline:
            so, _ = p.step()
            if not so.num_scheduled_tokens:
                time.sleep(0.001)
        sent = [sorted(o.finished_sending) for o in p.outputs if o.finished_sending]
        print(json.dumps({"finished_sending": sent}), flush=True)
    finally:
        p.close()


if __name__ == "__main__":
    main()
