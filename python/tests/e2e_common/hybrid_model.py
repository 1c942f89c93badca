"""Tiny hybrid models of random weights (fixed seed) for the real-engine
suites, saved as Hugging Face model directories with model.py's tokenizer:
one whose layers differ in attention is what puts vLLM's hybrid KV cache
manager (HMA) to work, with a KV cache group per kind of layer.

- make_swa_model: Gemma 3 text (Gemma3ForCausalLM), one sliding-window layer
  and one full-attention layer: Gemma 3 is the sliding-window family people
  serve, its config names each layer's kind (layer_types), and vLLM's CPU
  attention runs it (no logit soft-capping, unlike Gemma 2). Two layers of
  different kinds: two KV cache groups of one layer each. The window (WINDOW
  tokens, two blocks of the suites' 32) leaves most of a 300-token prompt's
  blocks outside it."""
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
