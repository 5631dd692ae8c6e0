"""Turn a trained SmolLM2 draft checkpoint into the folder shipped as ``xpuspec/models/default_draft``.

    python -m research.training.smollm2_export --checkpoint DIR/draft --metrics DIR/metrics.json \
        --out xpuspec/models/default_draft

Runs ``xpuspec prepare CHECKPOINT --weights int8`` (the draft alone, as a target-only bundle), then keeps
the IR, ``config.json``, the tokenizer files for the pair check and the chat template; the target's
tokenizer IRs are not shipped (the default-model cache copies them in). Writes the training metrics as
``training_metrics.json`` and the draft stamp (``default_model.DRAFT_STAMP``) last, so the default
model's cache key changes with the draft without hashing 18 MB on every open.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from xpuspec.models.default_model import DRAFT_STAMP, write_draft_stamp

logger = logging.getLogger(__name__)

NOT_SHIPPED = frozenset(
    {
        "openvino_tokenizer.xml",
        "openvino_tokenizer.bin",
        "openvino_detokenizer.xml",
        "openvino_detokenizer.bin",
    }
)
SIZE_LIMIT_BYTES = 20 * 1000 * 1000  # the limit for the shipped int8 draft


def export_draft(checkpoint: Path, metrics: Path | None, out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="draft-export-") as scratch:
        bundle = Path(scratch) / "bundle"
        command = [sys.executable, "-m", "xpuspec.cli", "prepare", str(checkpoint), "-o", str(bundle)]
        subprocess.run([*command, "--weights", "int8"], check=True)
        model_dir = bundle / "target"
        weights = (model_dir / "openvino_model.bin").stat().st_size
        if weights > SIZE_LIMIT_BYTES:
            raise ValueError(f"the int8 draft is {weights / 1e6:.1f} MB, over the 20 MB limit")
        staged = Path(scratch) / "staged"
        staged.mkdir()
        for path in model_dir.iterdir():
            if path.is_file() and path.name not in NOT_SHIPPED:
                shutil.copy2(path, staged / path.name)
        if metrics is not None:
            shutil.copy2(metrics, staged / "training_metrics.json")
        write_draft_stamp(staged)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(staged, out)
    logger.info(
        "wrote %s (%s)", out, ", ".join(sorted(p.name for p in out.iterdir() if p.name != DRAFT_STAMP))
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="the trainer's DIR/draft")
    parser.add_argument("--metrics", type=Path, help="the trainer's DIR/metrics.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    export_draft(args.checkpoint, args.metrics, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
