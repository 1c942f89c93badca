"""P/D with several KV cache groups (vLLM's hybrid KV cache manager): which
of a prefill's blocks a decode pulls, per group, in NixlConnector's
convention, and the refusal of two engines whose groups differ.

The prefill's kv_transfer_params (``sent``):

- ``remote_block_ids``: a tuple (a list once JSON) with one list of G1
  block ids per kept group (groups.KvGroups.kept, vLLM's order), clipped as
  NixlConnector's ``get_exchange_clipped_blocks`` clips them: a full
  attention group's every computed block; a sliding window's in-window
  tail, ``cdiv(window, block_size) + 1`` entries (window plus vLLM's
  extra retained tokens, 0 unless a spec sets them; its out-of-window entries
  were nulled by vLLM before, and the tail may start with such nulls); a
  Mamba group (kind ``"mamba"``) only its running state's slot, one block
  (the speculative scratch slots after it dropped). Null ids (0) are never
  read.
- ``kvbm_groups``: each kept group's layout (``layout``): its index, kind,
  tokens per block, and a window's tokens. A prefill with one group sends
  none, and a flat ``remote_block_ids`` (as before HMA).

The decode (``pairs``) takes a list per group from the tail, as
NixlConnector's worker does: the prefill's list ends at its last computed
block, which is the decode's last prompt block. Each group's block at a
position goes into the decode's own block of that group at that position;
a position where the decode's table is null is skipped, and so is a window
block before the window the decode needs (the token it computes again
attends back ``window - 1`` tokens): out-of-window blocks are never pulled.
A block the decode needs that the prefill did not send (a full group's
shorter list, a window block the prefill had let go) fails the request.

A Mamba group (NixlConnector's convention, ``_prefill_backoff``): a
decode needs the state after N-1 prompt tokens, h(N-1), to compute the
last prompt token itself (a state after N tokens cannot take that token
again). The prefill stops one token short (``truncate_for_prefill``, once
per request, as vLLM adds it: its prompt loses its last token and it
samples one), so its state slot holds h(N-1) and its lists end at its block
for N-1 tokens; the decode loads N-1 prompt tokens (``remote_tokens``), the
state slot into its own block that vLLM's align mode reads h(N-1) from
(table entry cdiv(N-1, block_size) - 1), and computes the last one.

Between tensor-parallel sizes, attention groups are head-sliced as one
group's blocks are (tp_mapping.py, kv_views.py: every group's views must
hold as many heads per block). A Mamba state is not: its conv state is the
concatenation of sub-projections each sharded over the ranks and its SSM
state is sharded by heads (NixlConnector 0.34 reads the sub-projections one
by one, ``_build_mamba_remote``); kvbm pulls a Mamba hybrid between equal
TP sizes only and refuses another pair at the request (``pairs``).

Two engines whose groups differ (one hybrid, one not, or other kinds,
block sizes, windows) are refused: the decode names both layouts once per
prefill engine, pulls nothing, tells the prefill to let go, and reports the
request failed (failed_recving, vLLM's one failure report with several
groups; with one group too, since its blocks are not what it asked).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .groups import NULL_BLOCK, KvGroup, KvGroups

__all__ = ["layout", "describe", "sent", "pairs", "log_refusal", "State", "backoff",
           "remote_tokens", "truncate_for_prefill"]

log = logging.getLogger(__name__)

#: A decode request's pull: (remote ids, local ids, why refused or "").
State = Tuple[List[int], List[int], str]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def layout(groups: KvGroups) -> List[Dict[str, Any]]:
    """The kept groups as kv_transfer_params kvbm_groups says them (a
    prefill's), or as a decode compares them (with one group: the full
    attention group 0 a prefill without kvbm_groups has)."""
    out = []
    for g in groups.kept:
        d: Dict[str, Any] = {"group": g.index, "kind": g.kind, "block_size": g.block_size}
        if g.kind == "window":
            d["window"] = g.window
        out.append(d)
    return out


def describe(lay: Any) -> str:
    """A layout for a message: "none (one full-attention group)" style."""
    if not isinstance(lay, list):
        return repr(lay)[:200]
    parts = []
    for d in lay[:16]:
        if not isinstance(d, dict):
            parts.append(repr(d)[:40])
            continue
        s = f"group {d.get('group')} {d.get('kind')} ({d.get('block_size')} tokens/block"
        if d.get("kind") == "window":
            s += f", window {d.get('window')} tokens"
        parts.append(s + ")")
    return "[" + "; ".join(parts) + "]"


def backoff(groups: KvGroups) -> int:
    """Prompt tokens a prefill leaves for the decode to compute (vLLM's
    NixlConnector ``_prefill_backoff``): 1 with a Mamba group, else 0."""
    return 1 if groups.mamba else 0


def remote_tokens(groups: KvGroups, prompt_tokens: int) -> int:
    """The prompt tokens a decode loads from its prefill (NixlConnector's
    ``_get_remote_prefill_token_count``): all but the backoff."""
    b = backoff(groups)
    return prompt_tokens - b if b and prompt_tokens > b else prompt_tokens


def _skips_external_kv(request: Any) -> bool:
    """A request that reads no external KV (prompt logprobs): the decode
    loads nothing for it, so its prefill computes it whole."""
    skip = getattr(request, "skip_reading_external_kv", None)  # vLLM 0.34
    if skip is None:
        get = getattr(request, "get_skip_reading_prefix_cache", None)  # 0.33
        skip = get() if callable(get) else False
    return bool(skip)


def truncate_for_prefill(groups: KvGroups, request: Any) -> bool:
    """A prefill request (do_remote_decode) of a model with a Mamba group
    loses its last backoff prompt tokens and samples one token, so that its
    state is h(N-1) (NixlConnector's ``_truncate_request_for_prefill``);
    once per request (kv_transfer_params ``_p_side_truncated``: a preempted
    request is added again as it is). Returns whether it truncated."""
    b = backoff(groups)
    params = getattr(request, "kv_transfer_params", None)
    if not b or not params or not params.get("do_remote_decode") \
            or params.get("_p_side_truncated") or request.num_prompt_tokens <= b \
            or _skips_external_kv(request):
        return False
    if request.prompt_token_ids is not None:
        del request.prompt_token_ids[-b:]
    elif getattr(request, "prompt_embeds", None) is not None:
        request.prompt_embeds = request.prompt_embeds[:-b]
    else:
        return False
    del request._all_token_ids[-b:]
    request.num_prompt_tokens -= b
    request.max_tokens = 1
    # Hashes of blocks the tokens dropped no longer fill (vLLM 0.34 has a
    # call for it; 0.33 computed them as the request was made).
    hbs = max(1, groups.block_size // max(1, groups.hashes_per_block))
    trunc = getattr(request, "truncate_block_hashes", None)
    if callable(trunc):
        trunc(hbs)
    else:
        del request.block_hashes[max(0, request.num_tokens) // hbs:]
    params["_p_side_truncated"] = True
    return True


def _state_slot(blocks: Sequence[int], spec_blocks: int) -> List[int]:
    """A Mamba group's running state's slot: the last entry once the
    speculative scratch slots after it are dropped (vLLM's
    clip_ssm_state_blocks)."""
    if not blocks:
        return []
    scratch = min(spec_blocks, len(blocks) - 1)
    blocks = list(blocks[:len(blocks) - scratch])
    return blocks[-1:]


def _clip(g: KvGroup, blocks: Sequence[int]) -> List[int]:
    """What a prefill sends of group g's blocks (NixlConnector's clipping)."""
    blocks = [int(b) for b in blocks]
    if g.kind == "window":
        return blocks[-(_cdiv(g.window + g.retained, g.block_size) + 1):]
    if g.kind == "mamba":
        return _state_slot(blocks, int(getattr(g, "spec_blocks", 0) or 0))
    return blocks


def sent(groups: KvGroups, block_ids: Sequence[Sequence[int]]
         ) -> Tuple[Tuple[List[int], ...], List[int]]:
    """(remote_block_ids: each kept group's clipped list, the G1 blocks
    they name that are not null: what the prefill holds for the decode)
    from vLLM's block ids of a finished request, one list per group."""
    lists = tuple(_clip(g, block_ids[g.index] if g.index < len(block_ids) else ())
                  for g in groups.kept)
    held: List[int] = []
    seen: Set[int] = set()
    for lst in lists:
        for b in lst:
            if b != NULL_BLOCK and b not in seen:
                seen.add(b)
                held.append(b)
    return lists, held


def _their_layout(params: dict) -> Any:
    """The prefill's layout: kvbm_groups, or one full-attention group when
    it sends a flat list (a prefill with one group, or before HMA)."""
    lay = params.get("kvbm_groups")
    if lay is not None:
        return lay
    ids = params.get("remote_block_ids")
    if isinstance(ids, (list, tuple)) and (not ids or not isinstance(ids[0], (list, tuple))
                                           or len(ids) == 1):
        # One group (NixlConnector's form of it: a list of one list): its
        # block size is the decode's to check, as before.
        return None
    return "several lists and no kvbm_groups (not a kvbm prefill with several groups)"


def _one_list(ids: Any) -> List[int]:
    """A one-group prefill's blocks, flat or NixlConnector's [[...]]."""
    if isinstance(ids, (list, tuple)) and len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return _ids(ids) or []


def _ids(lst: Any) -> Optional[List[int]]:
    if not isinstance(lst, (list, tuple)) or len(lst) > 1 << 20:
        return None
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in lst):
        return None
    return [int(b) for b in lst]


def pairs(groups: KvGroups, params: dict, tables: Sequence[Sequence[int]], start: int,
          num_external_tokens: int, tp_size: int = 1) -> State:
    """The pull of a decode request whose blocks from start on (num_external_tokens
    tokens) come from the prefill that params (its kv_transfer_params) name:
    (the prefill's G1 blocks, this decode's, in pairs; why it is refused, or
    ""). tables: the decode's block tables, one per vLLM group; tp_size:
    this decode's tensor-parallel size."""
    bs = groups.block_size
    end = _cdiv(start * bs + num_external_tokens, bs)
    theirs = _their_layout(params)
    if not groups.hybrid:
        if theirs is None:  # one group on both sides: positional, as before
            ids = _one_list(params.get("remote_block_ids"))
            return ids[start:end], list(tables[0][start:end]), ""
        return [], list(tables[0][start:end]), _refusal(theirs, groups)
    mine = layout(groups)
    local_all = [b for g in groups.kept for b in tables[g.index][start:end] if b != NULL_BLOCK]
    if theirs != mine:
        return [], local_all, _refusal(theirs, groups)
    why = _mamba_tp_refusal(groups, params.get("tp_size") or 1, tp_size)
    if why:
        return [], local_all, why
    lists = params.get("remote_block_ids")
    if not isinstance(lists, (list, tuple)) or len(lists) != len(groups.kept):
        return [], local_all, "remote_block_ids is not one list per KV cache group"
    n = end
    tokens = params.get("remote_num_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        n = _cdiv(tokens, bs)  # the prefill's lists end at its last computed block
    remote: List[int] = []
    local: List[int] = []
    for g, lst in zip(groups.kept, lists):
        ids = _ids(lst)
        if ids is None:
            return [], local_all, f"group {g.index}'s remote_block_ids are not block ids"
        table = tables[g.index]
        if g.kind == "mamba":
            # The block vLLM's align mode reads the state after the loaded
            # tokens from: entry cdiv(tokens, block_size) - 1.
            mine_slot = [table[end - 1]] if 0 < end <= len(table) else []
            if mine_slot and ids and mine_slot[0] != NULL_BLOCK and ids[-1] != NULL_BLOCK:
                remote.append(ids[-1])
                local.append(mine_slot[0])
            elif mine_slot and mine_slot[0] != NULL_BLOCK:
                return [], local_all, f"the prefill sent no state for group {g.index}"
            continue
        # The first block this decode needs: a window's, for the token it
        # computes again (the last prompt token) attending back.
        need = g.first_kept_block(start * bs + num_external_tokens - 1)
        first = n - len(ids)
        for pos in range(start, end):
            mine_b = table[pos] if pos < len(table) else NULL_BLOCK
            if mine_b == NULL_BLOCK or pos < need:
                continue
            theirs_b = ids[pos - first] if first <= pos < n else NULL_BLOCK
            if theirs_b == NULL_BLOCK:
                return [], local_all, (f"the prefill did not send block {pos} of group "
                                       f"{g.index} ({g.kind}), which this decode needs")
            remote.append(theirs_b)
            local.append(mine_b)
    return remote, local, ""


def _mamba_tp_refusal(groups: KvGroups, theirs: Any, mine: int) -> str:
    """Why a Mamba hybrid's pull between these TP sizes is refused, or ""."""
    if not groups.mamba or theirs == mine:
        return ""
    g = groups.mamba[0]
    return (f"the prefill has tensor-parallel size {theirs!r}, this decode {mine}, and group "
            f"{g.index} is a Mamba group: its state (conv sub-projections and SSM heads, "
            f"each sharded over the ranks) cannot be sliced as attention heads are; kvbm "
            f"pulls a Mamba hybrid between equal tensor-parallel sizes only")


def _refusal(theirs: Any, groups: KvGroups) -> str:
    mine = describe(layout(groups)) if groups.hybrid else \
        f"one group ({groups.block_size} tokens/block)"
    them = "one group (a flat remote_block_ids)" if theirs is None else (
        theirs if isinstance(theirs, str) else describe(theirs))
    return (f"the prefill's KV cache groups are {them}, this decode's {mine}: P/D needs the "
            f"same groups on both sides")


_logged: Set[Tuple[str, str]] = set()


def log_refusal(req_id: str, engine_id: str, why: str) -> None:
    """Says a refused pull's reason once per prefill engine and reason."""
    if (engine_id, why) in _logged or len(_logged) >= 1024:
        return
    _logged.add((engine_id, why))
    log.error("kvbm: request %s from prefill engine %s: %s; nothing is pulled and the request "
              "fails (every such request)", req_id, engine_id[:128], why)
