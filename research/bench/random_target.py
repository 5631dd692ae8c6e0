"""A larger, randomly initialised Llama target beside a draft, as a bundle: the engine at a realistic size.

    python -m research.bench.random_target -o BUNDLE [--draft DRAFT] [--hidden 768 --layers 12]

The target takes the draft's tokenizer and vocabulary, so the pair passes the pairing check; its
weights are random, so the draft is rarely accepted. What it measures is the engine around a
model whose step costs milliseconds (``xpuspec bench --bundle BUNDLE``), not speculation gains.

``--draft`` is a Hugging Face checkpoint folder (prepared with the target) or, by default, the demo
bundle's draft IR, which is already int8: the target is then prepared alone and the draft folder is
copied in beside it (prepare refuses to recompress an int8 IR). :func:`random_target_bundle` builds
the default (110M parameters, int8 weights, the demo draft) once into the user cache and reuses it.
Needs the conversion extra (torch, transformers, optimum-intel).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from pathlib import Path

from xpuspec.models.demo import BUNDLE_DIR
from xpuspec.prepare import PrepareConfig, prepare_bundle

logger = logging.getLogger(__name__)

DEMO_BUNDLE = BUNDLE_DIR
MANIFEST = "xpuspec.json"


def build_random_target(
    tokenizer_source: Path, out_dir: Path, hidden_size: int, num_layers: int, seed: int = 0
) -> tuple[Path, int]:
    """Save a random Llama with the tokenizer (and vocabulary) of ``tokenizer_source`` to ``out_dir``;
    return it and its parameter count. ``tokenizer_source`` holds a ``config.json`` and tokenizer files
    (a checkpoint or an IR folder)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    draft_config = AutoConfig.from_pretrained(tokenizer_source)
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
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out_dir)
    return out_dir, sum(p.numel() for p in model.parameters())


def _is_ir(folder: Path) -> bool:
    return (folder / "openvino_model.xml").is_file()


def _attach_draft_ir(bundle: Path, draft_bundle: Path) -> None:
    """Copy ``draft_bundle``'s draft folder into ``bundle`` and rewrite the manifest with its entry.

    The pair shares one tokenizer (the target was built from the draft's), which is what the pairing
    check of prepare would confirm; the manifest records it as checked.
    """
    from xpuspec.models.bundle import hash_tree

    source = json.loads((draft_bundle / MANIFEST).read_text(encoding="utf-8"))
    manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
    if manifest["tokenizer"]["vocab_size"] != source["tokenizer"]["vocab_size"]:
        raise ValueError("the draft's vocabulary differs from the random target's")
    shutil.copytree(draft_bundle / source["models"]["draft"]["path"], bundle / "draft")
    manifest["models"]["draft"] = {**source["models"]["draft"], "path": "draft"}
    manifest["pairing"] = {"checked": True, "forced": False, "mismatch": None}
    manifest.pop("files", None)
    manifest["files"] = hash_tree(bundle)  # the manifest itself is not listed: it is written last
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def build_bundle(
    output: Path,
    draft: Path = DEMO_BUNDLE,
    hidden_size: int = 768,
    num_layers: int = 12,
    weights: str = "int8",
) -> int:
    """Write the bundle at ``output``; ``draft`` is a checkpoint folder or a bundle with a draft IR.
    Returns the target's parameter count."""
    draft = Path(draft)
    draft_is_bundle = (draft / MANIFEST).is_file()
    tokenizer_source = draft / "draft" if draft_is_bundle else draft
    with tempfile.TemporaryDirectory() as work:
        target, parameters = build_random_target(
            tokenizer_source, Path(work) / "target", hidden_size, num_layers
        )
        logger.info("random target: %.1fM parameters", parameters / 1e6)
        if draft_is_bundle or _is_ir(draft):
            if not draft_is_bundle:
                raise ValueError(f"{draft}: an IR draft must come inside a bundle (its manifest entry)")
            prepare_bundle(PrepareConfig(target=str(target), output=output, weights=weights))  # type: ignore[arg-type]
            _attach_draft_ir(output, draft)
        else:
            prepare_bundle(
                PrepareConfig(target=str(target), draft=str(draft), output=output, weights=weights)
            )  # type: ignore[arg-type]
    return parameters


def random_target_bundle(
    hidden_size: int = 768, num_layers: int = 12, weights: str = "int8", cache_root: Path | None = None
) -> Path:
    """The random target (default ~110M parameters, int8) with the demo draft, built once into the cache."""
    from xpuspec.models.bundle import cache_dir

    root = Path(cache_root) if cache_root is not None else cache_dir() / "bench"
    bundle = root / f"random-llama-h{hidden_size}-l{num_layers}-{weights}-demo-draft"
    if not (bundle / MANIFEST).is_file():
        root.mkdir(parents=True, exist_ok=True)
        build_bundle(bundle, DEMO_BUNDLE, hidden_size, num_layers, weights)
    return bundle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--draft",
        type=Path,
        default=None,
        help="the draft's Hugging Face checkpoint folder, or a bundle whose draft IR to copy "
        "(default: the demo bundle)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="the bundle folder to write (default: the cache)"
    )
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--weights", choices=["fp16", "int8", "int4"], default="int8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.output is None and args.draft is None:
        print(random_target_bundle(args.hidden, args.layers, args.weights))
        return 0
    if args.output is None:
        parser.error("--output is needed with --draft")
    build_bundle(args.output, args.draft or DEMO_BUNDLE, args.hidden, args.layers, args.weights)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
