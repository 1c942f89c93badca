"""The prefill instance of the two-process P/D test, run as its own
process: python prefill_process.py PORT PROMPTS, PROMPTS a JSON object
{request id: prompt}. Prefills every request (max_tokens 1,
do_remote_decode), prints one JSON line with each one's kv_transfer_params
and the hex bytes of each of its blocks (every layer), then steps as an
engine does and prints a line each time finished_sending names requests
(the decode was done with them), until it holds none or a minute passed."""
import json
import sys
import time

from harness import LAYERS, Engine, require_vllm

require_vllm()


def main() -> None:
    port = int(sys.argv[1])
    prompts = json.loads(sys.argv[2])
    p = Engine({"g2_blocks": 8, "pd_port": port}, role="kv_producer",
               engine_id="prefill-process")
    try:
        for req_id, prompt in prompts.items():
            p.add(req_id, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        while not all(r in p.finished for r in prompts):
            p.step()
        params = {r: p.finished[r].kv_transfer_params for r in prompts}
        blocks = {r: [[p.read(b, layer).numpy().tobytes().hex() for layer in range(len(LAYERS))]
                      for b in params[r]["remote_block_ids"]] for r in prompts}
        print(json.dumps({"params": params, "blocks": blocks}), flush=True)
        deadline = time.monotonic() + 60
        while p.sched.has_requests() and time.monotonic() < deadline:
            so, kvo = p.step()
            if kvo.finished_sending:
                print(json.dumps({"finished_sending": sorted(kvo.finished_sending)}), flush=True)
            if not so.num_scheduled_tokens:
                time.sleep(0.001)
    finally:
        p.close()


if __name__ == "__main__":
    main()
