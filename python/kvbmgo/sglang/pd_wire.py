"""What passes between the two sides of kvbm's SGLang PD backend: the
layout both must agree on, the control messages, and the bootstrap server.

Control messages (ZMQ multipart, on the managers' own sockets; ASCII
integers, nothing unpickled; each followed by the authentication frames of
``kvbmgo._control`` under the side's key (``_control.choose_key``: the
deployment key, or the same-host one), this channel's domain, and the
receiver's endpoint (``_control.endpoint``: the address and port it
listens on): ``Auth``)::

    decode -> prefill  KVBM_REG   once per prefill rank: who the decode is
    prefill -> decode  KVBM_META  reply: the prefill's name, endpoint, layouts'
                                  signature (no capability)
    decode -> prefill  KVBM_ROOM  per request: the decode reserved its pages
    prefill -> decode  KVBM_PULL  per sent chunk: source pages, the kvbm
                                  metadata that reads those pages only (+ aux
                                  row and state slots with their own scoped
                                  metadata, last; pd_state)
    decode -> prefill  KVBM_DONE  the decode owns the KV (or gave up): release
    prefill -> decode  KVBM_STATUS  the prefill failed the request (reason)

(KVBM_STATUS is SGLang's status message under kvbm's tag.) A frame over
CONTROL_MAX is refused as it arrives, never read whole.

The decode never holds a capability of the whole prefill worker: each
KVBM_PULL carries, per piece of its chunk, block-scoped metadata of every
prefill worker (``Worker.export_metadata(blocks=...)``) that reads that
piece's G1 blocks (the pages) only, until the waiting timeout; the prefill
revokes the room's pages when the room ends, before SGLang frees them. A
piece covers at most SCOPE_RUNS runs of consecutive pages, so that its
metadata stays within what kvbm's hello carries (32 KiB of ranges).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

from .. import _control
from .._layout import LayoutConfig

__all__ = ["KVGroup", "kv_groups", "signature", "TransferInfo", "KvbmKVBootstrapServer",
           "TAG_REG", "TAG_META", "TAG_ROOM", "TAG_PULL", "TAG_DONE", "TAG_STATUS",
           "CONTROL_MAX", "SCOPE_RUNS", "AUTH_DOMAIN", "LABEL", "Auth", "scope_pieces"]

TAG_REG = b"KVBM_REG"
TAG_META = b"KVBM_META"
TAG_ROOM = b"KVBM_ROOM"
TAG_PULL = b"KVBM_PULL"
TAG_DONE = b"KVBM_DONE"
TAG_STATUS = b"KVBM_STATUS"

# The largest control message a manager reads (_control.cap_frames): page
# indices of a request of 16M pages, with room for the metadata of many
# workers.
CONTROL_MAX = 64 << 20

#: The most runs of consecutive pages one piece's scoped metadata covers
#: (a scope carries at most about 4,000 ranges of blocks).
SCOPE_RUNS = 2048

#: The domain of this channel's MACs (_control.mac): a message signed for
#: another channel never verifies here.
AUTH_DOMAIN = b"kvbm sglang pd v1\0"
#: What the backend's log lines and errors start with.
LABEL = "kvbm transfer backend"


def _a(x: Any) -> bytes:
    return str(x).encode("ascii")


# ---- the layout

@dataclass(frozen=True)
class KVGroup:
    """KV buffers of one shape, registered as one kvbm worker's G1: each
    buffer is a "layer" of num_pages blocks of item_len bytes."""
    buffers: Tuple[int, ...]  # indices into kv_data_ptrs
    num_pages: int
    item_len: int

    def layout(self) -> LayoutConfig:
        return LayoutConfig(num_blocks=self.num_pages, num_layers=len(self.buffers),
                            outer_dim=1, page_size=1, inner_dim=self.item_len, dtype_width=1,
                            layout="layer_separate", block_dim="first")


def kv_groups(lens: Sequence[int], item_lens: Sequence[int], what: str = "KV"
              ) -> List[KVGroup]:
    """KVArgs' buffers (what: whose, for the errors) grouped by (pages, page
    bytes), in buffer order. Raises ValueError for a buffer smaller than a
    page or a bad length."""
    if len(lens) != len(item_lens) or not lens:
        raise ValueError(f"kvbm transfer backend: {len(lens)} {what} buffer lengths, "
                         f"{len(item_lens)} item lengths (need as many, at least one)")
    by_shape: Dict[Tuple[int, int], List[int]] = {}
    for i, (n, item) in enumerate(zip(lens, item_lens)):
        n, item = int(n), int(item)
        if item <= 0 or n < item:
            raise ValueError(f"kvbm transfer backend: {what} buffer {i} has {n} bytes, "
                             f"its page {item}")
        by_shape.setdefault((n // item, item), []).append(i)
    return [KVGroup(tuple(ix), pages, item) for (pages, item), ix in by_shape.items()]


def signature(groups: Sequence[KVGroup], aux_item_lens: Sequence[int],
              states: Sequence[Any] = ()) -> str:
    """What both sides must agree on (page counts may differ); states: the
    state components' part (pd_state.signature)."""
    return json.dumps({"kv": [[list(g.buffers), g.item_len] for g in groups],
                       "aux": [int(x) for x in aux_item_lens], "state": list(states)})


# ---- decode -> prefill

def registration(ip: str, port: int, token: str, sig: str, nonce: str) -> List[bytes]:
    """KVBM_REG: the decode's endpoint, name and layout signature, and a
    nonce the prefill's KVBM_META reply repeats."""
    return [TAG_REG, ip.encode("ascii"), _a(port), token.encode("ascii"), sig.encode(),
            nonce.encode("ascii")]


def parse_registration(msg: List[bytes]) -> Tuple[str, int, str, str, str]:
    """(ip, port, token, signature, nonce) of a KVBM_REG."""
    return (msg[1].decode("ascii"), int(msg[2]), msg[3].decode("ascii"), msg[4].decode(),
            msg[5].decode("ascii"))


@dataclass
class TransferInfo:
    """One decode rank's reservation for a room (KVBM_ROOM), as the prefill
    keeps it (the fields SGLang's common code reads: is_dummy, endpoint,
    dst_port, required_dst_info_num)."""
    room: int
    endpoint: str
    dst_port: int
    peer: str
    num_pages: int
    required_dst_info_num: int
    decode_prefix_len: int
    is_dummy: bool

    def frames(self) -> List[bytes]:
        return [TAG_ROOM, _a(self.room), self.endpoint.encode("ascii"), _a(self.dst_port),
                self.peer.encode("ascii"), _a(self.num_pages), _a(self.required_dst_info_num),
                _a(self.decode_prefix_len), _a(int(self.is_dummy))]

    @classmethod
    def parse(cls, msg: List[bytes]) -> "TransferInfo":
        return cls(room=int(msg[1]), endpoint=msg[2].decode(), dst_port=int(msg[3]),
                   peer=msg[4].decode(), num_pages=int(msg[5]),
                   required_dst_info_num=int(msg[6]), decode_prefix_len=int(msg[7]),
                   is_dummy=bool(int(msg[8])))


def done(room: int, token: str, status: int, reason: str) -> List[bytes]:
    """KVBM_DONE: the decode owns room's KV (status Success) or gave up."""
    return [TAG_DONE, _a(room), token.encode("ascii"), _a(int(status)), reason.encode("utf-8")]


def parse_done(msg: List[bytes]) -> Tuple[int, str, int, str]:
    """(room, decode token, status, reason) of a KVBM_DONE."""
    reason = msg[4].decode("utf-8", "replace") if len(msg) > 4 else ""
    return int(msg[1]), msg[2].decode(), int(msg[3]), reason


# ---- prefill -> decode

def layouts(token: str, rank: int, sig: str, ip: str, port: int, nonce: str) -> List[bytes]:
    """KVBM_META: the prefill's name, rank, signature, endpoint (the one it
    registered with the bootstrap server) and the nonce of the KVBM_REG it
    answers. No metadata: each room's comes with its KVBM_PULLs."""
    return [TAG_META, token.encode("ascii"), _a(rank), sig.encode(), ip.encode("ascii"),
            _a(port), nonce.encode("ascii")]


def parse_layouts(msg: List[bytes]) -> Tuple[str, str, Tuple[str, int], str]:
    """(prefill token, signature, endpoint, nonce) of a KVBM_META."""
    return (msg[1].decode("ascii"), msg[3].decode(), (msg[4].decode("ascii"), int(msg[5])),
            msg[6].decode("ascii"))


def scope_pieces(pages: np.ndarray, runs: int = SCOPE_RUNS) -> List[Tuple[int, int]]:
    """(offset, count) of consecutive pieces of pages, each made of at most
    runs runs of consecutive page indices: one block scope each (a set of
    pages has no more ranges than the runs that list it)."""
    if len(pages) == 0:
        return []
    starts = np.concatenate(([0], np.flatnonzero(np.diff(pages) != 1) + 1))
    cuts = [int(x) for x in starts[::runs]] + [len(pages)]
    return [(a, b - a) for a, b in zip(cuts, cuts[1:])]


#: One piece of a chunk as KVBM_PULL carries it: how many of the chunk's
#: pages it covers (in order), and each prefill worker's metadata scoped
#: to them.
Scope = Tuple[int, List[bytes]]


def pull(room: int, token: str, rank: int, start: int, pages: np.ndarray, last: bool,
         scopes: Sequence[Scope], aux_rows: Optional[List[bytes]],
         states: Sequence[Tuple[int, np.ndarray, List[bytes]]] = ()) -> List[bytes]:
    """KVBM_PULL: pages (int32) hold the request's pages from index start;
    scopes cover them in order (see Scope); the last one carries the aux rows
    and the room's state slots (states: pd_state.StateScope, each component
    with slots: its index, the slots, its workers' metadata scoped to them)."""
    workers = len(scopes[0][1]) if scopes else 0
    if any(len(mds) != workers for _, mds in scopes):
        raise ValueError("kvbm transfer backend: scopes with different worker counts")
    counts = ",".join(str(int(n)) for n, _ in scopes)
    # The states frame: "component:workers" per component with slots; then,
    # after the pages' metadata, each one's slots and its workers' metadata.
    desc = ",".join(f"{int(c)}:{len(mds)}" for c, _, mds in states)
    state_frames = [f for _, slots, mds in states
                    for f in [np.ascontiguousarray(slots, np.int32).tobytes(), *mds]]
    return ([TAG_PULL, _a(room), token.encode("ascii"), _a(rank), _a(start), pages.tobytes(),
             b"1" if last else b"0", _a(workers), counts.encode("ascii"),
             desc.encode("ascii")]
            + [md for _, mds in scopes for md in mds] + state_frames + (aux_rows or []))


def parse_pull(msg: List[bytes]) -> Tuple[int, str, int, np.ndarray, bool, List[Scope],
                                          List[bytes]]:
    """(room, prefill token, start, source pages, last, scopes, aux rows) of a
    KVBM_PULL (whether the scopes cover the pages is the receiver's check,
    after the sender's). Raises ValueError for missing frames."""
    pages = np.frombuffer(msg[5], dtype=np.int32)
    workers = int(msg[7])
    counts = [int(x) for x in msg[8].decode("ascii").split(",")] if msg[8] else []
    if workers < 0 or len(msg) < 10 + len(counts) * workers:
        raise ValueError(f"kvbm transfer backend: a KVBM_PULL with {len(msg)} frames, "
                         f"scopes {counts} of {workers} workers")
    mds = list(msg[10:10 + len(counts) * workers])
    scopes = [(n, mds[i * workers:(i + 1) * workers]) for i, n in enumerate(counts)]
    states, end = _parse_states(msg, 10 + len(counts) * workers)
    return (int(msg[1]), msg[2].decode(), int(msg[4]), pages, msg[6] == b"1", scopes,
            list(msg[end:]))


def pull_states(msg: List[bytes]) -> List[Tuple[int, np.ndarray, List[bytes]]]:
    """The state slots a KVBM_PULL carries (see pull). Raises ValueError."""
    workers = int(msg[7])
    counts = [int(x) for x in msg[8].decode("ascii").split(",")] if msg[8] else []
    return _parse_states(msg, 10 + len(counts) * workers)[0]


def _parse_states(msg: List[bytes], at: int
                  ) -> Tuple[List[Tuple[int, np.ndarray, List[bytes]]], int]:
    """(the states of a KVBM_PULL whose state frames start at at, the index
    of the frame after them)."""
    out = []
    for entry in (msg[9].decode("ascii").split(",") if msg[9] else []):
        comp, n = (int(x) for x in entry.split(":"))
        if comp < 0 or n < 0 or len(msg) < at + 1 + n:
            raise ValueError(f"kvbm transfer backend: a KVBM_PULL with {len(msg)} frames, "
                             f"states {msg[9][:80]!r}")
        out.append((comp, np.frombuffer(msg[at], dtype=np.int32), list(msg[at + 1:at + 1 + n])))
        at += 1 + n
    return out, at


# ---- authentication (_control.choose_key)

class Auth(_control.Auth):
    """A manager's signing and checking of control messages
    (kvbmgo._control.Auth) under this channel's domain."""

    def __init__(self, key: Optional[bytes], token: str, side: str,
                 me: Optional[str] = None) -> None:
        super().__init__(key, token, side, domain=AUTH_DOMAIN, label=LABEL, me=me)

    def claimed_peer(self, msg: Sequence[bytes]) -> str:
        """Who a message says it is from (unchecked), for the logs."""
        try:
            tag = bytes(msg[0])
            if tag == TAG_REG:
                return f"{bytes(msg[1]).decode('ascii')}:{int(msg[2])} (claimed)"
            if tag == TAG_ROOM:
                return f"{bytes(msg[2]).decode('ascii')}:{int(msg[3])} (claimed)"
            if tag in (TAG_DONE, TAG_PULL, TAG_META):
                name = bytes(msg[1] if tag == TAG_META else msg[2]).decode("ascii")
                return f"token {name[:8]} (claimed)"
        except (IndexError, ValueError, UnicodeDecodeError):
            pass
        return super().claimed_peer(msg)


# ---- the bootstrap server

class KvbmKVBootstrapServer(CommonKVBootstrapServer):
    """SGLang's own bootstrap server (registration, /route, /health)."""

    def close(self) -> None:
        """As SGLang's, which stops nothing when called before its event loop
        runs (a close right after the start): waits for the loop first (5 s
        at most)."""
        deadline = time.monotonic() + 5
        while self.thread.is_alive() and time.monotonic() < deadline:
            loop = getattr(self, "_loop", None)
            if loop is not None and loop.is_running():
                break
            time.sleep(0.01)
        if getattr(self, "_loop", None) is None:
            return  # the server thread died before it made its loop
        super().close()
