"""Token embeddings for the head: the target IR's own embedding, cut out of its graph.

EAGLE-3 heads embed tokens with the target's table (published heads omit ``embed_tokens.weight``; the
EAGLE reference loads the target's ``model.embed_tokens.weight`` and freezes it). Rather than copying
the table out of the target (it may be int8/int4 compressed, and is the largest single weight of a
small model), :func:`target_embedding_model` cuts the target IR at its embedding: a new model from
``input_ids`` to the output of the Gather that reads the table, keeping the table's constants and
decompression chain as they are.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as opset

from xpuspec.executor.graph_edits import is_constant_like

logger = logging.getLogger(__name__)

INPUT_IDS, EMBEDDINGS = "input_ids", "embeddings"
_MODEL_FILE = "openvino_model.xml"
# Between input_ids and the Gather a model may convert the ids (i64 -> i32); nothing else.
_ID_PASSTHROUGH = {"Convert"}


def _embedding_gather(input_ids: ov.Node) -> ov.Node:
    """The Gather whose indices are ``input_ids`` (through Converts) and whose data is a weight."""
    frontier = [input_ids.output(0)]
    while frontier:
        output = frontier.pop()
        for consumer in output.get_target_inputs():
            node = consumer.get_node()
            kind = node.get_type_name()
            if kind == "Gather" and consumer.get_index() == 1 and is_constant_like(node.input_value(0)):
                return node
            if kind in _ID_PASSTHROUGH:
                frontier.append(node.output(0))
    raise ValueError(
        f"no embedding Gather fed by '{INPUT_IDS}' (a Gather of a weight table indexed by the ids, "
        f"possibly through a Convert): not a decoder IR this can cut"
    )


def target_embedding_model(target: str | Path | ov.Model, core: ov.Core | None = None) -> ov.Model:
    """The target's embedding alone: ``input_ids`` (the target's own shape) -> ``embeddings`` f32.

    ``target`` is an IR folder (``openvino_model.xml``), an ``.xml`` path, or a model (cloned, not
    changed). The output is the Gather's result as the target computes it (dequantised when the table
    is compressed), before anything a model may apply after it (e.g. Gemma's sqrt(hidden) scale):
    EAGLE-3 embeds with the raw table.
    """
    if isinstance(target, ov.Model):
        model = target.clone()
    else:
        path = Path(target)
        path = path / _MODEL_FILE if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"no target IR at {path}")
        model = (core or ov.Core()).read_model(path)
    by_name = [p for p in model.get_parameters() if INPUT_IDS in p.output(0).get_names()]
    if not by_name:
        raise ValueError(
            f"the target has no '{INPUT_IDS}' input (inputs: "
            f"{[sorted(p.output(0).get_names()) for p in model.get_parameters()]})"
        )
    input_ids = by_name[0]
    gather = _embedding_gather(input_ids)
    embeddings = gather.output(0)
    if embeddings.get_element_type() != ov.Type.f32:
        embeddings = opset.convert(embeddings, ov.Type.f32).output(0)
    embeddings.get_tensor().set_names({EMBEDDINGS})
    result = opset.result(embeddings)
    result.set_friendly_name(EMBEDDINGS)
    logger.debug("target embedding cut at '%s'", gather.get_friendly_name())
    return ov.Model([result], [input_ids], "target_embedding")


def table_embedding_model(table: np.ndarray) -> ov.Model:
    """An embedding model over a table ``[vocab, hidden]`` (a head that ships its own ``embed_tokens``)."""
    input_ids = opset.parameter(ov.PartialShape([-1, -1]), ov.Type.i64, name=INPUT_IDS)
    input_ids.output(0).get_tensor().set_names({INPUT_IDS})
    gathered = opset.gather(opset.constant(np.asarray(table, np.float32)), input_ids, np.int64(0))
    gathered.output(0).get_tensor().set_names({EMBEDDINGS})
    return ov.Model([opset.result(gathered)], [input_ids], "table_embedding")
