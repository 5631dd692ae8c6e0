"""A larger, randomly initialised Llama target beside a draft, as a bundle: the engine at a realistic size.

    python -m xpuspec.bench.random_target --draft DRAFT_CHECKPOINT -o BUNDLE [--hidden 768 --layers 12]

The target takes the draft's tokenizer and vocabulary, so the pair passes the pairing check; its
weights are random, so the draft is rarely accepted. What it measures is the engine around a
model whose step costs milliseconds (``xpuspec bench --bundle BUNDLE``), not speculation gains.
Needs the conversion extra (torch, transformers, optimum-intel).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from xpuspec.prepare import PrepareConfig, prepare_bundle

logger = logging.getLogger(__name__)


def build_random_target(
    draft_checkpoint: Path, out_dir: Path, hidden_size: int, num_layers: int, seed: int = 0
) -> tuple[Path, int]:
    """Save a random Llama with the draft's tokenizer to ``out_dir``; return it and its parameter count."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    draft_config = AutoConfig.from_pretrained(draft_checkpoint)
    config = LlamaConfig(
        vocab_size=draft_config.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=max(1, hidden_size // 256),
        max_position_embeddings=draft_config.max_position_embeddings,
        bos_token_id=draft_config.bos_token_id,
        eos_token_id=draft_config.eos_token_id,
        pad_token_id=draft_config.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(draft_checkpoint).save_pretrained(out_dir)
    return out_dir, sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--draft", type=Path, required=True, help="the draft's Hugging Face checkpoint folder"
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="the bundle folder to write")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--weights", choices=["fp16", "int8", "int4"], default="int8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as work:
        target, parameters = build_random_target(args.draft, Path(work) / "target", args.hidden, args.layers)
        logger.info("random target: %.1fM parameters", parameters / 1e6)
        prepare_bundle(
            PrepareConfig(target=str(target), draft=str(args.draft), output=args.output, weights=args.weights)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
