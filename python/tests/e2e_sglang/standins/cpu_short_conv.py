"""A stand-in for the causal 1-D convolution of SGLang's Mamba-kind layers
on a CPU-only machine (LFM2's short convolution): SGLang 0.5.23 runs it
with a compiled kernel on CUDA and with Triton kernels elsewhere, and
Triton has no CPU backend here. Here the same two calls in torch, with the
semantics their docstrings give: conv_states[slot] holds a sequence's last
width-1 inputs (dim, width-1), read as the initial state where asked and
updated in place.

Applied by sitecustomize.py of this directory when SGLang imports
sglang.srt.layers.attention.mamba.causal_conv1d; the installed files are
not touched."""
import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1


def _conv(xp, weight, bias, activation):
    """xp (dim, width-1+n) -> (dim, n): depthwise causal convolution."""
    dim, width = weight.shape
    out = F.conv1d(xp.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), bias,
                   groups=dim).squeeze(0)
    return F.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_fn(x, weight, bias=None, query_start_loc=None, cache_indices=None,
                     has_initial_state=None, conv_states=None, activation="silu",
                     pad_slot_id=PAD_SLOT_ID, **kwargs):
    """x (dim, tokens of every sequence) -> the same shape."""
    width = weight.shape[1]
    starts = [0, x.shape[-1]] if query_start_loc is None else query_start_loc.tolist()
    out = torch.empty_like(x)
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        slot = None if cache_indices is None else int(cache_indices[b])
        if slot == pad_slot_id:
            continue
        init = torch.zeros(x.shape[0], width - 1, dtype=x.dtype, device=x.device)
        if slot is not None and has_initial_state is not None and bool(has_initial_state[b]):
            init = conv_states[slot, :, -(width - 1):].to(x.dtype)
        xp = torch.cat([init, x[:, s:e]], dim=-1)
        out[:, s:e] = _conv(xp, weight, bias, activation).to(x.dtype)
        if slot is not None and conv_states is not None:
            conv_states[slot, :, -(width - 1):] = xp[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         cache_seqlens=None, conv_state_indices=None,
                         pad_slot_id=PAD_SLOT_ID):
    """x (batch, dim) or (batch, dim, n): one step (or n) per sequence."""
    if cache_seqlens is not None:
        raise RuntimeError("causal_conv1d_update stand-in: circular conv states "
                           "(cache_seqlens) are not implemented")
    width = weight.shape[1]
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    out = torch.empty_like(xs)
    for b in range(xs.shape[0]):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if slot == pad_slot_id:
            continue
        xp = torch.cat([conv_state[slot, :, -(width - 1):].to(xs.dtype), xs[b]], dim=-1)
        out[b] = _conv(xp, weight, bias, activation).to(xs.dtype)
        conv_state[slot, :, -(width - 1):] = xp[:, -(width - 1):].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


def apply(module) -> None:
    """sglang.srt.layers.attention.mamba.causal_conv1d: torch convolutions."""
    module.causal_conv1d_fn = causal_conv1d_fn
    module.causal_conv1d_update = causal_conv1d_update
