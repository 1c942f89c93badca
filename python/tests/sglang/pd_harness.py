"""SGLang's own PD objects for the kvbm transfer backend tests: the runtime
context a scheduler publishes (from SGLang's ServerArgs over a tiny local
model config), SGLang's KVArgs filled as prefill.py/decode.py fill them (MHA:
every K layer then every V layer, one page of one layer per item; the
metadata buffers' rows as aux), and drivers that call the manager, sender and
receiver in the order SGLang's schedulers do. Also run as a script: the
prefill side of the two-process test."""
import json
import os
import socket
import sys
import time

import numpy as np

LAYERS, PAGE, HEADS, HEAD_DIM, ITEM = 3, 4, 2, 8, 2  # fp16: ITEM bytes per element
PAGE_BYTES = PAGE * HEADS * HEAD_DIM * ITEM
AUX_ITEM_LENS = (64, 64, 512, 64)  # output ids, cached tokens, hidden states, bootstrap room
AUX_ROWS = 8
# Hybrid models' state buffers, shaped as SGLang's pools hand them over: a
# Mamba pool (per layer a float32 temporal state and a bf16 conv state per
# slot: slots of two sizes) and an SWA pool (K and V of each sliding-window
# layer, a page a slot).
MAMBA_LAYERS, MAMBA_SLOTS, MAMBA_ITEMS = 2, 6, (4 * 8 * 4, 16 * 3 * 2)
SWA_LAYERS, SWA_PAGES = 2, 10

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
          "rms_norm_eps": 1e-5, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publish(model_dir, mode, bootstrap_port):
    """Publishes the runtime context a scheduler of mode publishes (SGLang's
    CommonKVManager reads it), the backend being "kvbm" (the plugin's name)."""
    from kvbmgo.sglang import plugin
    plugin.add_backend_name()
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    sa = ServerArgs(model_path=model_dir, skip_tokenizer_init=True, host="127.0.0.1",
                    disaggregation_mode=mode, disaggregation_transfer_backend="kvbm",
                    disaggregation_bootstrap_port=bootstrap_port, device="cpu",
                    page_size=PAGE)
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    # No torch.distributed here: the pipeline group is only used with pp > 1.
    rc.get_parallel().override_permanently(pp_group=None)
    return sa


class Side:
    """One engine's KV pool and metadata buffers, as numpy arrays whose raw
    pointers go into SGLang's KVArgs: MHA, every K layer then every V layer
    (mla: one buffer per layer, a wider page); draft: two more layers of a
    draft model's pool, with a smaller page (a second kvbm layout)."""

    def __init__(self, pages, seed=None, mla=False, draft=False, states=()):
        self.pages, self.mla = pages, mla
        self.items = [PAGE * 72 * ITEM] * LAYERS if mla else [PAGE_BYTES] * (2 * LAYERS)
        if draft:
            self.items += [PAGE_BYTES // 2] * 2
        rng = np.random.default_rng(seed) if seed is not None else None

        def buf(shape):
            if rng is None:
                return np.zeros(shape, np.uint8)
            return rng.integers(0, 256, shape, dtype=np.uint8)
        self.kv = [buf(pages * item) for item in self.items]
        self.aux = [buf((AUX_ROWS, n)) for n in AUX_ITEM_LENS]
        # states: "mamba" / "swa" per component, in KVArgs order; each a list
        # of buffers (slots x item bytes)
        self.state_kinds = list(states)
        self.state = []
        for kind in self.state_kinds:
            if kind == "mamba":
                shapes = [(MAMBA_SLOTS, MAMBA_ITEMS[0])] * MAMBA_LAYERS + \
                    [(MAMBA_SLOTS, MAMBA_ITEMS[1])] * MAMBA_LAYERS
            else:
                shapes = [(SWA_PAGES, PAGE_BYTES)] * (2 * SWA_LAYERS)
            self.state.append([buf(shape) for shape in shapes])

    def kv_any(self):
        return any(b.any() for b in self.kv)

    def kv_args(self, engine_rank=0):
        from sglang.srt.disaggregation.base import KVArgs
        a = KVArgs()
        a.engine_rank = engine_rank
        a.pp_rank = 0
        a.system_dp_rank = 0
        a.rust_http_port = None
        a.kv_cache_dtype_str = "float16"
        a.kv_layout = None
        a.prefill_start_layer = 0
        a.prefill_end_layer = LAYERS
        a.kv_data_ptrs = [int(b.ctypes.data) for b in self.kv]
        a.kv_data_lens = [int(b.nbytes) for b in self.kv]
        a.kv_item_lens = list(self.items)
        a.num_draft_entries = len(self.items) - (LAYERS if self.mla else 2 * LAYERS)
        a.kv_layer_ids = list(range(len(self.items)))
        a.kv_head_num = HEADS
        a.total_kv_head_num = HEADS
        a.page_size = PAGE
        a.aux_data_ptrs = [int(b.ctypes.data) for b in self.aux]
        a.aux_data_lens = [int(b.nbytes) for b in self.aux]
        a.aux_item_lens = [int(b[0].nbytes) for b in self.aux]
        a.ib_device = None
        a.gpu_id = 0
        a.state_types = []
        a.state_data_ptrs = []
        a.state_data_lens = []
        a.state_item_lens = []
        a.state_layer_ids = []
        a.state_dim_per_tensor = []
        a.state_conv_shard_groups = []
        a.state_slice_outer_counts = []
        from sglang.srt.disaggregation.base.conn import StateType
        from sglang.srt.disaggregation.utils import append_state_component
        for kind, bufs in zip(self.state_kinds, self.state):
            # SGLang's own helper, as setup_state_kv_args calls it
            append_state_component(a, StateType(kind), [int(b.ctypes.data) for b in bufs],
                                   [int(b.nbytes) for b in bufs],
                                   [int(b[0].nbytes) for b in bufs])
        return a

    def slot(self, comp, buf, i):
        """Slot i of buffer buf of state component comp."""
        return self.state[comp][buf][i]

    def state_any(self):
        return any(b.any() for bufs in self.state for b in bufs)

    def page(self, buf, page):
        item = self.items[buf]
        return self.kv[buf][page * item:(page + 1) * item]


def manager(side, mode, server_args):
    from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType
    from kvbmgo.sglang.plugin import kv_class
    cls = kv_class(KVClassType.MANAGER)
    m = DisaggregationMode.PREFILL if mode == "prefill" else DisaggregationMode.DECODE
    return cls(side.kv_args(), m, server_args, side.mla)


def wait_for(poll, want, timeout, what):
    """Polls until poll() is one of want (a KVPoll value or a set); returns
    (state, seconds). Fails (AssertionError) on Failed unless wanted, or on
    the timeout."""
    from sglang.srt.disaggregation.base import KVPoll
    want = {want} if isinstance(want, int) else set(want)
    t0 = time.monotonic()
    while True:
        s = poll()
        if s in want:
            return s, time.monotonic() - t0
        if s == KVPoll.Failed:
            x = getattr(poll, "__self__", None)
            why = x.kv_mgr.failure_records.get(x.bootstrap_room) if x is not None else None
            raise AssertionError(f"{what}: Failed while waiting for {want}: {why}")
        assert time.monotonic() - t0 < timeout, f"{what}: still {s} after {timeout}s"
        time.sleep(0.01)


def prefill_send(sender, pages, aux_row, chunks=2, num_pages=None, state=None):
    """What prefill.py does once the sender is WaitingForInput: init, then a
    send per chunk (the last one after the metadata row is written, with
    the state indices: state, or [] for a model without state)."""
    pages = np.asarray(pages, dtype=np.int32)
    sender.init(len(pages) if num_pages is None else num_pages, aux_row)
    parts = np.array_split(pages, chunks)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        sender.send(part, (state if state is not None else []) if last else None,
                    num_kv_tokens=len(part) * PAGE)


def mamba_indices(slot):
    """A Mamba slot as prefill.py/decode.py pass it: a list holding the
    numpy form of a 0-d int32 tensor."""
    return [np.array(slot, dtype=np.int32)]


def _prefill_main(argv):
    """The prefill side of the two-process test: bootstrap server, manager,
    and one request's sender driven to Success or Failed; prints one JSON
    line per event."""
    port, room, seed, pages_json, aux_row, model_dir = argv
    pages = json.loads(pages_json)
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.utils import KVClassType
    from kvbmgo.sglang.plugin import kv_class
    sa = publish(model_dir, "prefill", int(port))
    server = kv_class(KVClassType.BOOTSTRAP_SERVER)("127.0.0.1", int(port))
    side = Side(4 * len(pages) + 4, seed=int(seed))
    mgr = manager(side, "prefill", sa)
    print(json.dumps({"event": "ready"}), flush=True)
    sender = kv_class(KVClassType.SENDER)(mgr, f"127.0.0.1:{port}", int(room))
    # Started at the beginning of the test module: the decode comes later.
    wait_for(sender.poll, KVPoll.WaitingForInput, 280, "prefill sender")
    prefill_send(sender, pages, int(aux_row))
    state, _ = wait_for(sender.poll, {KVPoll.Success, KVPoll.Failed}, 60, "prefill sender")
    print(json.dumps({"event": "done", "state": int(state)}), flush=True)
    # A second request the prefill never computes: the test kills this
    # process while the decode waits for it.
    second = kv_class(KVClassType.SENDER)(mgr, f"127.0.0.1:{port}", int(room) + 1)
    wait_for(second.poll, KVPoll.WaitingForInput, 60, "prefill sender 2")
    print(json.dumps({"event": "reserved"}), flush=True)
    time.sleep(120)


if __name__ == "__main__":
    _prefill_main(sys.argv[1:])
