"""The byte check of the PD tests: kvbm's PD transfer backend with the
digest of every page the prefill sent (as it hands a chunk over, after the
forward wrote it) and of every page the decode received (when its receiver
first reports Success, before the decode's forward). The test compares them
page by page, in token order. A hybrid model's state buffers
(KVArgs.state_types: the sliding-window pool's pages, Mamba slots) are
recorded the same way, per state component, for the slots each side names
(state_indices: the prefill's with its last chunk, the decode's with its
metadata). Records go where recording_storage.py writes
its own ($KVBM_E2E_RECORDS/records-<pid>.jsonl).

install() wraps the classes kvbm's plugin hands SGLang; engine.py calls it
at import, so in SGLang's scheduler process too (it imports engine.py
again)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from types import SimpleNamespace
from typing import Any, List

_lock = threading.Lock()


def _write(rec: dict) -> None:
    path = os.path.join(os.environ["KVBM_E2E_RECORDS"], f"records-{os.getpid()}.jsonl")
    with _lock, open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def digests(kv_args: Any, pages: Any) -> List[str]:
    """sha256 of each page over every K and V layer of SGLang's KV pool
    (KVArgs: one page of one layer per item)."""
    out = []
    for p in [int(x) for x in pages]:
        h = hashlib.sha256()
        for ptr, item in zip(kv_args.kv_data_ptrs, kv_args.kv_item_lens):
            h.update(ctypes.string_at(int(ptr) + p * int(item), int(item)))
        out.append(h.hexdigest())
    return out


def state_digests(kv_args: Any, state_indices: Any) -> List[List[str]]:
    """Per state component, sha256 of each slot named in state_indices over
    every buffer of the component (one slot of one buffer per item)."""
    out = []
    for i, slots in enumerate(state_indices or []):
        ptrs, items = kv_args.state_data_ptrs[i], kv_args.state_item_lens[i]
        out.append(digests(SimpleNamespace(kv_data_ptrs=ptrs, kv_item_lens=items),
                           [] if slots is None else slots))
    return out


def install() -> None:
    from sglang.srt.disaggregation.base.conn import KVPoll

    from kvbmgo.sglang.pd_decode import KvbmKVReceiver
    from kvbmgo.sglang.pd_prefill import KvbmKVSender

    if getattr(KvbmKVSender, "_e2e_recording", False):
        return
    send, send_metadata, poll = KvbmKVSender.send, KvbmKVReceiver.send_metadata, \
        KvbmKVReceiver._poll

    def recording_send(self, kv_indices, state_indices=None, *args, **kwargs):
        room, kv_args = int(self.bootstrap_room), self.kv_mgr.kv_args
        if len(kv_indices):
            _write({"ev": "pd-sent", "room": room, "digests": digests(kv_args, kv_indices)})
        if state_indices:
            _write({"ev": "pd-state-sent", "room": room,
                    "states": state_digests(kv_args, state_indices)})
        return send(self, kv_indices, state_indices, *args, **kwargs)

    def recording_send_metadata(self, kv_indices, aux_index=None, state_indices=None,
                                *args, **kwargs):
        self._e2e_pages = [int(x) for x in kv_indices]
        self._e2e_states = state_indices
        return send_metadata(self, kv_indices, aux_index, state_indices, *args, **kwargs)

    def recording_poll(self):
        status = poll(self)
        pages = getattr(self, "_e2e_pages", None)
        if status == KVPoll.Success and pages is not None:
            self._e2e_pages = None
            _write({"ev": "pd-received", "room": int(self.bootstrap_room),
                    "digests": digests(self.kv_mgr.kv_args, pages)})
            if getattr(self, "_e2e_states", None):
                _write({"ev": "pd-state-received", "room": int(self.bootstrap_room),
                        "states": state_digests(self.kv_mgr.kv_args, self._e2e_states)})
        return status

    KvbmKVSender.send = recording_send
    KvbmKVReceiver.send_metadata = recording_send_metadata
    KvbmKVReceiver._poll = recording_poll
    KvbmKVSender._e2e_recording = True
