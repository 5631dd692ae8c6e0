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

optimum-intel 2.2.0 exports exactly this for ``LlamaForCausalLMEagle3`` heads (``model_patcher.
LlamaEagle3ForCausalLM``, ``Eagle3DummyGenerator``, ``_add_eagle3_mode_to_rt_info``), but
``optimum-cli``/``main_export`` load that class as remote code whose import check asks for diffusers and
einops, so :func:`convert_head` builds the class directly and exports it with ``export_from_model``.

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
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xpuspec.bench.peers import genai_unavailable

logger = logging.getLogger(__name__)

CACHE_FOLDER = "genai_eagle3"
MODEL_FILE = "openvino_model.xml"
# Bump when the converted form changes, so cached conversions are not reused.
FORMAT_VERSION = 2  # 2: matrices int8 like xpuspec's head (HEAD_WEIGHT_TYPE)
_TOKENIZER_GLOBS = ("openvino_tokenizer.*", "openvino_detokenizer.*")


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


def target_embedding_table(target_dir: Path, vocab_size: int) -> np.ndarray:
    """The target's embedding table ``[vocab, hidden]`` f32, as the target IR computes it (dequantised)."""
    import openvino as ov

    from xpuspec.executor.eagle3_embedding import target_embedding_model

    core = ov.Core()
    compiled = core.compile_model(
        target_embedding_model(target_dir, core), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    ids = np.arange(vocab_size, dtype=np.int64)[None]  # [1, vocab]
    return np.asarray(compiled(ids)[0][0], dtype=np.float32)


def convert_head(bundle: Any, cache: Path | None = None) -> Path:
    """The bundle's head as GenAI's EAGLE-3 draft folder, converted once into ``cache`` (default: the
    xpuspec cache) and reused while the head and target files are unchanged."""
    from xpuspec.model_bundle import cache_dir

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
        _export(head.path, bundle.target.path, layers, staging)
        if folder.exists():  # another process converted it meanwhile
            shutil.rmtree(staging)
        else:
            staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("converted the EAGLE-3 head for GenAI into %s (layers %s)", folder, layers)
    return folder


def _export(head_dir: Path, target_dir: Path, layers: list[int], out: Path) -> None:
    import openvino as ov
    import torch
    from optimum.exporters.openvino.convert import export_from_model
    from optimum.exporters.openvino.model_patcher import LlamaEagle3ForCausalLM
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    class XpuspecEagle3Head(LlamaEagle3ForCausalLM):  # type: ignore[misc]
        """optimum infers the library from the class's module; under ``optimum.*`` it looks for a
        wrapped ``.model`` and fails, elsewhere it falls back to transformers' PreTrainedModel."""

    data = json.loads((head_dir / "config.json").read_text())
    config = LlamaConfig(**data)
    model = XpuspecEagle3Head(config).eval()
    state = {
        f"model.{name}": tensor.float() if tensor.is_floating_point() else tensor
        for name, tensor in load_file(str(head_dir / "model.safetensors")).items()
    }
    # Published heads have no embed_tokens: give the head the target's table, so the converted IR is
    # right on its own (GenAI also replaces it by the target's, but finds it by a name/size heuristic).
    table = target_embedding_table(target_dir, int(config.vocab_size))
    state.setdefault("model.embed_tokens.weight", torch.from_numpy(table))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"the head's tensors do not fit the EAGLE-3 export: missing {missing}, extra {unexpected}"
        )

    exported = out / "export"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch tracer warnings on the dynamic-shape checks
        export_from_model(model, exported, task="text-generation-with-past")
    core = ov.Core()
    ir = core.read_model(exported / MODEL_FILE)
    if not ir.has_rt_info("eagle3_mode"):
        raise ValueError("optimum-intel did not mark the export as EAGLE-3 (no eagle3_mode in its rt_info)")
    ir.set_rt_info(layers, "hidden_layers_list")  # read back by GenAI as std::vector<int>
    compress_head_matrices(ir)
    ov.save_model(ir, out / MODEL_FILE, compress_to_fp16=False)
    shutil.copy(exported / "config.json", out / "config.json")
    shutil.rmtree(exported)
    # The target's generation config and tokenizer: the export's config has Llama's default ids.
    for pattern in ("generation_config.json", *_TOKENIZER_GLOBS):
        for path in target_dir.glob(pattern):
            shutil.copy(path, out / path.name)


def compress_head_matrices(model: Any) -> int:
    """The head's linear layers (``MatMul`` by a constant ``[out, in]``) at xpuspec's head weights, in place.

    xpuspec runs the head with :data:`HEAD_WEIGHT_TYPE` matrices (int8 per output row); GenAI gets the
    very same int8 values, so the two engines compare on one head. The embedding table (a Gather) stays
    as it is: GenAI replaces it by the target's. Returns how many matrices were compressed.
    """
    import openvino as ov

    from xpuspec.executor.eagle3_graph import int8_weight
    from xpuspec.executor.eagle3_head import HEAD_WEIGHT_TYPE

    if HEAD_WEIGHT_TYPE != "int8":
        return 0
    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul" or not node.get_attributes().get("transpose_b"):
            continue
        weight = node.input_value(1).get_node()
        if (
            weight.get_type_name() != "Constant"
            or weight.get_output_element_type(0) != ov.Type.f32
            or len(weight.get_output_partial_shape(0)) != 2
        ):
            continue
        node.input(1).replace_source_output(int8_weight(weight.get_data(), weight.get_friendly_name()))
        count += 1
    model.validate_nodes_and_infer_types()
    logger.debug("GenAI's head: %d matrices at int8", count)
    return count


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
