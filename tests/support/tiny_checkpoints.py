"""Tiny random Hugging Face checkpoints built locally (no hub): the test models of every suite."""

from __future__ import annotations

from pathlib import Path

from research.training.data import CHAT_TEMPLATE, SPECIAL_TOKENS  # noqa: F401  (re-exported for tests)

# A little text with code in it, so the byte-level BPE learns some merges.
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nprint(os.path.join('a', 'b'))\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "for i in range(10):\n    if i % 2 == 0:\n        continue\n    yield i\n",
]

ARCHITECTURES = ("llama", "qwen2", "mistral", "phi3")


def make_tokenizer(out_dir: Path, vocab_size: int = 384, corpus_suffix: str = ""):
    """Train a byte-level BPE tokenizer (the demo recipe's) and save it in ``out_dir``.

    ``corpus_suffix`` changes the training text, and so the merges: two different suffixes give
    two tokenizers whose vocabularies differ (the mismatched-pair case).
    """
    from research.training.data import train_tokenizer

    fast = train_tokenizer([text + corpus_suffix for text in _CORPUS * 4], vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def make_tiny_checkpoint(
    out_dir: Path,
    architecture: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 384,
    max_position_embeddings: int = 512,
    seed: int = 0,
    corpus_suffix: str = "",
) -> Path:
    """Save a randomly initialised causal LM with its tokenizer to ``out_dir`` and return it."""
    import torch
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    tokenizer = make_tokenizer(out_dir, vocab_size=vocab_size, corpus_suffix=corpus_suffix)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    }[architecture]
    torch.manual_seed(seed)
    model = model_class(config_class(**common)).eval()
    # Random init gives near-uniform logits, where float noise flips argmax ties; a larger
    # output scale makes greedy decoding decisive, as with a trained model.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out_dir)
    return out_dir


def make_perturbed_draft(target_dir: Path, out_dir: Path, noise: float = 0.02, seed: int = 1) -> Path:
    """A draft that agrees with the target often but not always: the target's weights plus noise.

    Random drafts of random targets accept almost nothing, which leaves the acceptance paths
    untested; a perturbed copy accepts a good share of tokens and rejects the rest.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * noise * parameter.std())
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out_dir)
    return out_dir
