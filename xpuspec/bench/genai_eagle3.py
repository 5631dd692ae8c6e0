"""OpenVINO GenAI's EAGLE-3 on a bundle's head: the draft IR GenAI loads, and its pipeline (bench only).

What the installed GenAI (2026.4.1) needs, read from its sources (``src/cpp/src/speculative_decoding/
eagle3_model_transforms.cpp``, ``llm/pipeline.cpp``) and checked by running it:

- the head as a stateful draft IR ``openvino_model.xml`` with inputs ``input_ids``, ``hidden_states``
  (the three tapped target states concatenated, ``[b, n, 3 * hidden]``), ``attention_mask``,
  ``position_ids``, ``beam_idx``, and outputs ``logits`` (draft vocabulary) and ``d2t`` (a Constant
  whose name holds "d2t", which GenAI removes and uses as the draft-to-target map). GenAI moves the head's
  ``fc`` (the MatMul reading the ``hidden_states`` Parameter) into the target, finds the head's output
  state in ``midlayer`` and shares the target's embedding table with the head;
- ``eagle3_mode`` in the IR's rt_info (``utils::eagle3::apply_eagle3_rt_info``) and the three target
  layers, ``hidden_layers_list``, either in the rt_info or as a ``draft_model`` property. The property
  must be a ``std::vector<int32_t>`` ("hidden_layers_list must be a vector of int32_t values"); the
  Python binding turns a list into int64s, so it cannot be passed from Python. Without it GenAI
  defaults to ``{2, n/2, n-3}`` and asserts ``n >= 10``. So the layers go into the rt_info here;
- a tokenizer in the draft folder (``draft_model`` reads ``Tokenizer(models_path)``).

optimum-intel exports exactly this for ``LlamaForCausalLMEagle3`` heads; the conversion, which needs
torch, lives in :mod:`xpuspec.prepare.genai_eagle3_export`.

Layer ids. GenAI taps ``layers.{id}/``'s MLP residual Add, the *output* of layer ``id``, i.e. xpuspec's
boundary ``id + 1`` (:mod:`xpuspec.executor.hidden_taps`); the head's boundaries ``b`` become ``b - 1``, and
a head reading boundary 0 (the embedding output) cannot run on GenAI.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xpuspec.bench.peers import genai_unavailable
from xpuspec.prepare.genai_eagle3_export import MODEL_FILE, export_genai_eagle3_head

logger = logging.getLogger(__name__)

CACHE_FOLDER = "genai_eagle3"
# Bump when the converted form changes, so cached conversions are not reused.
FORMAT_VERSION = 2  # 2: matrices int8 like xpuspec's head (HEAD_WEIGHT_TYPE)


def genai_layer_ids(tap_layers: Sequence[int]) -> list[int]:
    """GenAI's ``hidden_layers_list`` for a head tapping ``tap_layers`` (boundaries): ``b - 1`` each.

    Raises ValueError when GenAI cannot tap them: boundary 0 (the embedding output, not a layer's output)
    or a repeated layer (GenAI asserts it finds exactly three distinct layer outputs).
    """
    layers = [int(layer) for layer in tap_layers]
    if len(layers) != 3:
        raise ValueError(f"GenAI's EAGLE-3 fuses three target layers; the head taps {layers}")
    if min(layers) < 1:
        raise ValueError(
            f"the head taps boundaries {layers}; boundary 0 is the embedding output, and GenAI taps only "
            f"decoder layers' outputs (boundary b = the output of layer b - 1)"
        )
    if len(set(layers)) != 3:
        raise ValueError(f"the head taps boundaries {layers}; GenAI needs three distinct layers")
    return [layer - 1 for layer in layers]


def genai_eagle3_unavailable(bundle: Any) -> str | None:
    """Why GenAI cannot run the bundle's EAGLE-3 head here (the report's "not run: <reason>"), or None."""
    reason = genai_unavailable()
    if reason is not None:
        return reason
    if bundle.eagle3 is None:
        return "the bundle has no EAGLE-3 head"
    for module, extra in (("torch", "convert"), ("optimum.exporters.openvino", "convert")):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            return f"converting the head for GenAI needs {module} (pip install 'xpuspec[{extra}]')"
    try:
        config = bundle.eagle3.config()
        genai_layer_ids(bundle.eagle3.tap_layers)
    except Exception as error:  # noqa: BLE001 - any reason the head cannot be read is the row's reason
        return f"the head cannot run on GenAI: {error}"
    if config.norm_before_residual:
        return (
            "the head has norm_before_residual (vLLM's variant); optimum-intel's EAGLE-3 export, which GenAI "
            "loads, keeps the raw hidden state as the residual"
        )
    if bundle.target.facts.get("gguf"):
        # GenAI looks for its taps by the layout optimum-intel exports; a target read from GGUF has
        # another, and GenAI fails with a multi-line C++ exception (docs/benchmarks.md).
        return (
            "GenAI's EAGLE-3 cannot tap a target converted from GGUF (export the target with optimum-intel)"
        )
    return None


def _cache_key(bundle: Any) -> str:
    """A digest of the head and target files (their manifest hashes) and the converted form's version."""
    files = bundle.manifest.get("files") or {}
    parts = {
        name: digest
        for name, digest in files.items()
        if name.startswith(("eagle3/", "target/openvino_model", "target/openvino_tokenizer"))
    }
    if not parts:  # a manifest without hashes: fall back to the files' sizes and times
        parts = {str(p): str(p.stat().st_mtime_ns) for p in sorted(bundle.eagle3.path.iterdir())}
    text = json.dumps({"version": FORMAT_VERSION, "files": parts, "layers": list(bundle.eagle3.tap_layers)})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def convert_head(bundle: Any, cache: Path | None = None) -> Path:
    """The bundle's head as GenAI's EAGLE-3 draft folder, converted once into ``cache`` (default: the
    xpuspec cache) and reused while the head and target files are unchanged."""
    from xpuspec.models.bundle import cache_dir

    head = bundle.eagle3
    if head is None:
        raise ValueError("the bundle has no EAGLE-3 head (xpuspec prepare TARGET --eagle3 HEAD_DIR)")
    layers = genai_layer_ids(head.tap_layers)
    root = Path(cache) if cache is not None else cache_dir() / CACHE_FOLDER
    folder = root / _cache_key(bundle)
    if (folder / MODEL_FILE).is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        export_genai_eagle3_head(head.path, bundle.target.path, layers, staging)
        if folder.exists():  # another process converted it meanwhile
            shutil.rmtree(staging)
        else:
            staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("converted the EAGLE-3 head for GenAI into %s (layers %s)", folder, layers)
    return folder


def genai_eagle3_pipeline(
    bundle: Any, properties: dict[str, Any], num_assistant_tokens: int, cache: Path | None = None
) -> Any:
    """GenAI's ``LLMPipeline`` on the bundle's target drafting with its head, ``num_assistant_tokens``
    tokens per step (a chain: GenAI's tree search stays off), prefix caching off, on CPU."""
    import openvino_genai

    from xpuspec.bench.peers import _scheduler_config

    draft_dir = convert_head(bundle, cache)
    draft = openvino_genai.draft_model(str(draft_dir), "CPU", **properties)
    pipe = openvino_genai.LLMPipeline(
        str(bundle.target.path), "CPU", draft_model=draft, scheduler_config=_scheduler_config(), **properties
    )
    config = pipe.get_generation_config()
    if config.eos_token_id < 0:
        # With a draft model GenAI's config comes without the target's eos (-1), and setting it back
        # fails ("'stop_token_ids' must be non-negative"): give it the bundle's.
        eos = [int(token) for token in bundle.eos_token_ids if int(token) >= 0]
        if eos:
            config.eos_token_id = eos[0]
            config.stop_token_ids = set(eos)
    config.num_assistant_tokens = num_assistant_tokens
    config.assistant_confidence_threshold = 0.0  # GenAI's EAGLE-3 takes only a fixed chain length
    pipe.set_generation_config(config)
    return pipe
