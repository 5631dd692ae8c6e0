"""The target's weight format: the GGUF reader's IR against NNCF re-compressions of the same weights.

    python -m research.bench.weight_formats layers --work /tmp/wf [--rounds 4] [--prompts 12]
    python -m research.bench.weight_formats head --layers int4_sym_g64 --work /tmp/wf

``layers``: the default model's target as GenAI's GGUF reader converts it (``gguf``: Q4_1 layers, the
tied Q8_0 embedding / LM head) against its layers re-compressed (:mod:`xpuspec.prepare.gguf_weights`)
to int4 sym/asym in groups of 32/64/128 and int8 per channel, the LM head as converted. ``head``: the
LM-head variants (int8 per channel, int4 groups of 32/64/128 of the layers' symmetry) on one layer format.

Each variant is a bundle of the target alone (a copy of the default bundle's target with the IR swapped),
run by ``Pipeline(drafter="none")`` at the default properties (the same for every variant: the CPU
plugin's defaults follow the manifest's weight label, which is none of "int4"/"int8" here), and:

- ``step ms``: the median batch-1 decode step (time after the first token / tokens after it) over
  slots: in each round each timed prompt goes through every variant in turn (order reversed every other
  slot); ``ratio``: the median of the per-slot ratios to the first variant's;
- ``vs exact``: greedy text (EOS honoured) against the *first* variant's text in exact mode (f32 compute,
  f32 KV, no dynamic quantisation), the reference today's default is judged by;
- ``vs own exact``: the variant at default properties against itself in exact mode;
- ``bin MB``: the IR's weight file.

Instructions: the bench's chat questions (xpuspec.bench.workloads), then the default model's held-out
chat instructions to make up ``--prompts``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuspec.bench.workloads import CHAT_QUESTIONS
from xpuspec.prepare.gguf_formats import INT4_GROUPS, GgufWeightFormat
from xpuspec.prepare.gguf_weights import recompress_ir

logger = logging.getLogger(__name__)

HELDOUT = Path(__file__).resolve().parents[2] / "xpuspec" / "models" / "demo" / "smollm2_heldout.jsonl"
IR_FILES = ("openvino_model.xml", "openvino_model.bin")
LAYER_VARIANTS = (
    ("gguf",)
    + tuple(f"int4_{kind}_g{group}" for kind in ("sym", "asym") for group in INT4_GROUPS)
    + ("int8_asym",)
)


def head_variants(layers: str) -> tuple[str, ...]:
    """The LM-head variants on ``layers``: as converted first (the reference), then int8, then int4."""
    kind = "asym" if "asym" in layers else "sym"
    heads = ("int8_asym",) + tuple(f"int4_{kind}_g{group}" for group in INT4_GROUPS)
    return (layers,) + tuple(f"{layers}+head_{head}" for head in heads)


def chat_instructions(count: int) -> list[list[dict[str, str]]]:
    messages = [[{"role": "user", "content": question}] for question in CHAT_QUESTIONS]
    for line in HELDOUT.read_text(encoding="utf-8").splitlines():
        if len(messages) >= count:
            break
        messages.append(json.loads(line)["messages"])
    return messages[:count]


def decode_step_ms(stats: dict[str, Any]) -> float | None:
    """Milliseconds per token after the first, from a request's stats (None with fewer than 2 tokens)."""
    count, rate, ttft = stats.get("num_output_tokens"), stats.get("tokens_per_s"), stats.get("ttft_s")
    if not count or count < 2 or not rate or ttft is None:
        return None
    return 1000.0 * (count / rate - ttft) / (count - 1)


def variant_bundle(base: Path, work: Path, label: str) -> Path:
    """A bundle of ``base``'s target alone with its IR re-compressed to ``label`` (built once, kept)."""
    from xpuspec.models.bundle import MANIFEST_NAME, hash_tree

    root = work / label
    if (root / MANIFEST_NAME).is_file():
        return root
    staging = work / f".{label}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(base / "target", staging / "target", ignore=shutil.ignore_patterns(*IR_FILES))
    weight_format = GgufWeightFormat.parse(label)
    if weight_format.as_converted:
        for name in IR_FILES:
            shutil.copy2(base / "target" / name, staging / "target" / name)
        done: dict[str, Any] = {}
    else:
        started = time.perf_counter()
        done = recompress_ir(base / "target" / IR_FILES[0], staging / "target" / IR_FILES[0], weight_format)
        logger.info("%s built in %.0f s", label, time.perf_counter() - started)
    manifest = json.loads((base / MANIFEST_NAME).read_text(encoding="utf-8"))
    manifest["models"] = {"target": manifest["models"]["target"]}
    manifest["eagle3"] = None
    manifest["pairing"] = {"checked": False, "forced": False, "mismatch": None}
    compression = manifest["models"]["target"]["compression"]
    if done:
        # The weight label stays none of "int4"/"int8": the plugin's defaults stay the converted IR's.
        compression.update(mode=f"{compression['mode']} recompressed {label}", weights=label, nncf=done)
    manifest["files"] = hash_tree(staging)
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    staging.rename(root)
    return root


@dataclass
class Variant:
    label: str
    bundle: Path
    pipe: Any = None
    tokens: list[list[int]] = field(default_factory=list)
    exact_tokens: list[list[int]] = field(default_factory=list)
    steps_ms: list[float] = field(default_factory=list)  # one per slot (a prompt in a round)

    @property
    def bin_mb(self) -> float:
        return (self.bundle / "target" / IR_FILES[1]).stat().st_size / 1e6


def _pipeline(bundle: Path, properties: Any) -> Any:
    from xpuspec import Pipeline

    return Pipeline(bundle, drafter="none", properties=properties, use_placement=False, startup_cache=False)


def _greedy(pipe: Any, prompts: list[Any], max_tokens: int) -> list[list[int]]:
    from xpuspec.planning.agreement import greedy_token_ids

    return greedy_token_ids(pipe, prompts, max_tokens)


def _timed_round(variants: list[Variant], prompts: list[Any], max_tokens: int, reverse: bool) -> None:
    """Each prompt through every variant in turn (one slot per prompt): the load of a shared machine moves
    in seconds, so variants compared within one slot see nearly the same."""
    from xpuspec.sample.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        for variant in variants[::-1] if reverse else variants:
            (result,) = variant.pipe.generate([prompt], params)
            step = decode_step_ms(result.stats)
            variant.steps_ms.append(step if step is not None else float("nan"))
        reverse = not reverse


def measure(
    labels: tuple[str, ...],
    base: Path,
    work: Path,
    prompts: int,
    max_tokens: int,
    rounds: int,
    timed: int,
    agreement: bool = True,
) -> list[dict[str, Any]]:
    from xpuspec.planning.agreement import compare

    work.mkdir(parents=True, exist_ok=True)
    variants = [Variant(label, variant_bundle(base, work, label)) for label in labels]
    instructions = chat_instructions(prompts)
    for variant in variants:  # exact mode first, one pipeline at a time: its memory goes before the next
        if agreement:
            pipe = _pipeline(variant.bundle, "exact")
            variant.exact_tokens = _greedy(pipe, instructions, max_tokens)
            del pipe
            gc.collect()
        variant.pipe = _pipeline(variant.bundle, None)
        variant.tokens = _greedy(variant.pipe, instructions if agreement else instructions[:1], max_tokens)
        logger.info("%s: ready", variant.label)
    for index in range(rounds):
        _timed_round(variants, instructions[:timed], max_tokens, reverse=index % 2 == 1)
        logger.info("round %d: %s", index + 1, {v.label: round(v.steps_ms[-1], 2) for v in variants})

    def agree(reference: list[list[int]], got: list[list[int]]) -> str:
        return compare(reference, got).describe() if agreement else "-"

    reference = variants[0]
    rows = []
    for variant in variants:
        ratios = [
            s / b for s, b in zip(variant.steps_ms, reference.steps_ms, strict=True) if s == s and b == b
        ]
        rows.append(
            {
                "variant": variant.label,
                "step_ms": round(statistics.median(v for v in variant.steps_ms if v == v), 2),
                "ratio": round(statistics.median(ratios), 3),
                "ratios": [round(r, 3) for r in ratios],
                "vs_reference_exact": agree(reference.exact_tokens, variant.tokens),
                "vs_own_exact": agree(variant.exact_tokens, variant.tokens),
                "exact_vs_reference_exact": agree(reference.exact_tokens, variant.exact_tokens),
                "bin_mb": round(variant.bin_mb, 1),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| variant | step ms | ratio | vs reference exact | vs own exact | bin MB |",
        "|---|---:|---:|---|---|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['variant']} | {row['step_ms']:.2f} | {row['ratio']:.3f} | {row['vs_reference_exact']} "
            f"| {row['vs_own_exact']} | {row['bin_mb']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stage", choices=("layers", "head"))
    parser.add_argument("--layers", default="int4_sym_g64", help="head: the layer format under the heads")
    parser.add_argument("--work", type=Path, required=True, help="where the variant bundles are built (kept)")
    parser.add_argument(
        "--bundle", type=Path, default=None, help="the GGUF bundle (default: the default model)"
    )
    parser.add_argument("--only", default=None, help="comma-separated variants instead of the stage's")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--timed-prompts", type=int, default=3, help="prompts per variant per timed round")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--timing-only", action="store_true", help="no agreement (its columns show -)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.bundle is None:
        from xpuspec.models.default_model import default_bundle_path

        args.bundle = default_bundle_path()
    labels = LAYER_VARIANTS if args.stage == "layers" else head_variants(args.layers)
    if args.only:
        labels = tuple(label.strip() for label in args.only.split(",") if label.strip())
    rows = measure(
        labels,
        args.bundle,
        args.work,
        args.prompts,
        args.max_tokens,
        args.rounds,
        args.timed_prompts,
        agreement=not args.timing_only,
    )
    for row in rows:
        print(json.dumps(row), flush=True)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
