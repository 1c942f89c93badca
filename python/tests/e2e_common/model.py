"""The tiny model of the real-engine suites: a Llama of random weights
(fixed seed) with an offline word-level tokenizer, saved as a Hugging Face
model directory; prompts of token ids; a free port."""
import random
import socket

LAYERS, KV_HEADS, HEAD = 2, 2, 32   # head size 32: vLLM's CPU attention takes no smaller
VOCAB = 1000


def make_model(path: str) -> None:
    """Writes the model (config, weights, tokenizer) into path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=KV_HEADS * 2 * HEAD, intermediate_size=256,
                      num_attention_heads=4, num_key_value_heads=KV_HEADS,
                      num_hidden_layers=LAYERS, vocab_size=VOCAB, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    randomize(model)
    model.save_pretrained(path)
    save_tokenizer(path)


def randomize(model) -> None:
    """Larger weights than the default init: far-apart logits, so that a
    wrong KV byte shows in the tokens more often."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)


def save_tokenizer(path: str) -> None:
    """The offline word-level tokenizer of every tiny model: w3..w999."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<pad>").save_pretrained(path)


def prompt(seed: int, n: int = 300):
    """n token ids, none of them special, from seed."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
