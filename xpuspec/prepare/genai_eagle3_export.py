"""A bundle's EAGLE-3 head exported as OpenVINO GenAI's EAGLE-3 draft IR (torch, optimum and transformers).

The bench (:mod:`xpuspec.bench.genai_eagle3`) compares xpuspec's EAGLE-3 with GenAI's on one head; this is
the conversion, kept in ``xpuspec.prepare`` because only ``prepare`` loads the conversion stack.

optimum-intel 2.2.0 exports what GenAI loads for ``LlamaForCausalLMEagle3`` heads (``model_patcher.
LlamaEagle3ForCausalLM``, ``Eagle3DummyGenerator``, ``_add_eagle3_mode_to_rt_info``), but
``optimum-cli``/``main_export`` load that class as remote code whose import check asks for diffusers and
einops, so :func:`export_genai_eagle3_head` builds the class directly and exports it with
``export_from_model``.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MODEL_FILE = "openvino_model.xml"
_TOKENIZER_GLOBS = ("openvino_tokenizer.*", "openvino_detokenizer.*")


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


def export_genai_eagle3_head(head_dir: Path, target_dir: Path, layers: list[int], out: Path) -> None:
    """The head in ``head_dir`` as GenAI's EAGLE-3 draft folder ``out``, tapping the target's ``layers``
    (GenAI's layer ids), with the target's embedding table, generation config and tokenizer."""
    import openvino as ov
    import torch
    from optimum.exporters.openvino.convert import export_from_model
    from optimum.exporters.openvino.model_patcher import LlamaEagle3ForCausalLM
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    class XpuspecEagle3Head(LlamaEagle3ForCausalLM):
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
