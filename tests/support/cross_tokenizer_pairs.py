"""Tiny pairs whose draft has a tokenizer of its own (speculation across tokenizers).

A random draft with another tokenizer agrees with a random target on almost nothing, which would leave
the drafter's accepting paths untested. So the draft here is the target's network re-indexed for its
own vocabulary: each draft token whose string the target's vocabulary also has gets the target's
embedding and output rows of that string; the others get random rows. Its tokenizer is trained on the
same text with fewer merges, so words split differently and ids differ: the drafter must translate
through text, and the target still accepts a good share of what it proposes.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_checkpoints import make_tokenizer

DRAFT_VOCAB = 320  # the target's tiny tokenizers have 384 ids: fewer merges, other splits and ids
# Text added to the draft tokenizer's training corpus: its merges, and so its ids, differ from the target's.
DRAFT_CORPUS_SUFFIX = "\nxyzzy plugh xyzzy plugh"


def make_foreign_tokenizer_draft(target_dir: Path, out_dir: Path, noise: float = 0.0, seed: int = 3) -> Path:
    """A draft of ``target_dir``'s network with a tokenizer of its own, saved to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_tokenizer = AutoTokenizer.from_pretrained(target_dir)
    draft_tokenizer = make_tokenizer(out_dir, vocab_size=DRAFT_VOCAB, corpus_suffix=DRAFT_CORPUS_SUFFIX)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    config = target.config
    config.vocab_size = len(draft_tokenizer)
    for role in ("bos", "eos", "pad"):
        setattr(config, f"{role}_token_id", getattr(draft_tokenizer, f"{role}_token_id"))
    draft = type(target)(config).eval()
    target_ids = target_tokenizer.get_vocab()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in draft.state_dict().items():
            source = target.state_dict().get(name)
            if source is not None and source.shape == parameter.shape:
                parameter.copy_(source)
                parameter.add_(torch.randn(parameter.shape, generator=generator) * noise * source.std())
        rows = (
            (draft.model.embed_tokens.weight, target.model.embed_tokens.weight),
            (draft.lm_head.weight, target.lm_head.weight),
        )
        for draft_rows, target_rows in rows:
            draft_rows.copy_(torch.randn(draft_rows.shape, generator=generator) * target_rows.std())
            for token, draft_id in draft_tokenizer.get_vocab().items():
                target_id = target_ids.get(token)
                if target_id is not None:
                    draft_rows[draft_id] = target_rows[target_id]
    draft.save_pretrained(out_dir)
    return out_dir
