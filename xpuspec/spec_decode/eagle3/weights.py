"""Load an EAGLE-3 head folder's weights into numpy arrays, checked against its config.

Formats: ``model.safetensors`` (or shards listed in ``model.safetensors.index.json``) read by a small
reader of the format here, without torch. A head published as ``pytorch_model.bin`` is converted once by
``xpuspec prepare TARGET --eagle3 HEAD`` (:mod:`xpuspec.prepare.eagle3`, the one place torch is read),
which stores it in the bundle as ``model.safetensors``.

Why not the ``safetensors`` package's numpy API: numpy has no bfloat16, and that API refuses bf16
tensors, the dtype most published heads are saved in (AngelSlim, SpecForge); and ``safetensors`` is not
a runtime dependency of xpuspec. The format is a little-endian u64 header length, a JSON header of
``{name: {dtype, shape, data_offsets}}`` and the raw bytes; reading it takes a few lines. The tests
check this reader against ``safetensors.numpy``.

Names and shapes (the EAGLE reference's ``Model`` in ``eagle/model/cnets.py``, saved as vLLM's
``llama_eagle3.py`` and SGLang's ``llama_eagle3.py`` load it): see :func:`expected_shapes`. Every
float tensor comes out f32; ``d2t`` int64; ``t2d`` bool.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xpuspec.spec_decode.eagle3.config import Eagle3HeadConfig

logger = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
D2T, T2D, EMBED_TOKENS = "d2t", "t2d", "embed_tokens.weight"

_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # widened to f32 below
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def expected_shapes(config: Eagle3HeadConfig) -> dict[str, tuple[int, ...]]:
    """The required tensors of a head and their shapes (``d2t`` only when the vocabularies differ)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    q_width = config.num_attention_heads * head_dim
    kv_width = config.num_key_value_heads * head_dim
    shapes = {
        "fc.weight": (hidden, 3 * hidden),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.hidden_norm.weight": (hidden,),
        # q/k/v read the concatenation [normed embedding, normed hidden].
        "midlayer.self_attn.q_proj.weight": (q_width, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv_width, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv_width, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, q_width),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "midlayer.mlp.gate_proj.weight": (config.intermediate_size, hidden),
        "midlayer.mlp.up_proj.weight": (config.intermediate_size, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, config.intermediate_size),
        "norm.weight": (hidden,),
        "lm_head.weight": (config.draft_vocab_size, hidden),
    }
    if config.draft_vocab_size != config.vocab_size:
        shapes[D2T] = (config.draft_vocab_size,)
    return shapes


@dataclass
class Eagle3HeadWeights:
    """A head's checked weights: ``tensors`` by published name (f32), and the vocabulary maps.

    ``d2t`` ``[draft_vocab]`` int64: target id = draft id + ``d2t[draft id]`` (zeros when the head
    drafts over the whole target vocabulary). ``t2d`` ``[vocab]`` bool: which target ids the head can
    draft. ``embed_tokens`` ``[vocab, hidden]`` when the head ships its own table (usually absent: the
    target's is used).
    """

    tensors: dict[str, np.ndarray]
    d2t: np.ndarray
    t2d: np.ndarray
    embed_tokens: np.ndarray | None = None

    @property
    def draft_to_target(self) -> np.ndarray:
        """The target id of every draft id: ``[draft_vocab]`` int64."""
        return np.arange(self.d2t.shape[0], dtype=np.int64) + self.d2t


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one ``.safetensors`` file as numpy (bf16 widened to f32)."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short to be a safetensors file")
    (header_length,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + header_length])
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a safetensors file (bad header: {error})") from None
    body = memoryview(data)[8 + header_length :]
    return {
        name: decode_tensor(
            entry["dtype"], entry["shape"], body[slice(*entry["data_offsets"])], f"{path}: tensor {name!r}"
        )
        for name, entry in header.items()
        if name != "__metadata__"
    }


def decode_tensor(
    dtype: str, shape: list[int], data: bytes | memoryview, source: str = "tensor"
) -> np.ndarray:
    """A tensor's little-endian bytes in safetensors dtype ``dtype`` as a numpy array of its own (bf16
    widened to f32)."""
    numpy_dtype = _SAFETENSORS_DTYPES.get(dtype)
    if numpy_dtype is None:
        raise ValueError(f"{source} has dtype {dtype}, which this reader does not read")
    array = np.frombuffer(data, dtype=np.dtype(numpy_dtype).newbyteorder("<")).reshape(shape)
    if dtype == "BF16":
        # bf16 is the upper half of an f32: shift the bits back into place.
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.copy()


def read_head_tensors(folder: str | Path) -> dict[str, np.ndarray]:
    """The raw tensors of a head folder, from whichever weight file it has."""
    folder = Path(folder)
    if (folder / SAFETENSORS_INDEX).is_file():
        weight_map = json.loads((folder / SAFETENSORS_INDEX).read_text())["weight_map"]
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(folder / shard))
        return tensors
    if (folder / SAFETENSORS_FILE).is_file():
        return read_safetensors(folder / SAFETENSORS_FILE)
    if (folder / TORCH_FILE).is_file():
        raise ValueError(
            f"{folder / TORCH_FILE} is a torch pickle, which xpuspec reads only when preparing a bundle: "
            f"`xpuspec prepare TARGET --eagle3 {folder}` stores the head as {SAFETENSORS_FILE}"
        )
    raise ValueError(f"no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {TORCH_FILE} in {folder}")


def check_head_tensors(
    tensors: dict[str, np.ndarray], config: Eagle3HeadConfig, source: str = "head"
) -> Eagle3HeadWeights:
    """Check names and shapes against ``config`` and build the vocabulary maps; one ValueError lists all."""
    shapes = expected_shapes(config)
    problems = [f"missing {name} {list(shape)}" for name, shape in shapes.items() if name not in tensors]
    problems += [
        f"{name} is {list(tensors[name].shape)}, expected {list(shape)}"
        for name, shape in shapes.items()
        if name in tensors and tuple(tensors[name].shape) != shape
    ]
    optional = {
        D2T: (config.draft_vocab_size,),
        T2D: (config.vocab_size,),
        EMBED_TOKENS: (config.vocab_size, config.hidden_size),
    }
    problems += [
        f"{name} is {list(tensors[name].shape)}, expected {list(shape)}"
        for name, shape in optional.items()
        if name in tensors and name not in shapes and tuple(tensors[name].shape) != shape
    ]
    if problems:
        raise ValueError(
            f"{source}: the weights do not fit the EAGLE-3 head config (hidden {config.hidden_size}, "
            f"draft vocabulary {config.draft_vocab_size}): {'; '.join(problems)}"
        )
    unknown = sorted(set(tensors) - set(shapes) - set(optional))
    if unknown:
        logger.warning("%s: ignoring tensors an EAGLE-3 head does not use: %s", source, unknown)

    d2t = tensors.get(D2T)
    d2t = np.zeros(config.draft_vocab_size, np.int64) if d2t is None else d2t.astype(np.int64)
    target_ids = np.arange(config.draft_vocab_size, dtype=np.int64) + d2t
    if target_ids.min() < 0 or target_ids.max() >= config.vocab_size:
        raise ValueError(
            f"{source}: d2t maps draft ids outside the target vocabulary 0..{config.vocab_size - 1}"
        )
    if np.unique(target_ids).shape[0] != target_ids.shape[0]:
        raise ValueError(f"{source}: d2t maps two draft ids to one target id")
    t2d = np.zeros(config.vocab_size, np.bool_)
    t2d[target_ids] = True
    if T2D in tensors and not np.array_equal(tensors[T2D].astype(np.bool_), t2d):
        raise ValueError(f"{source}: t2d does not mark exactly the target ids d2t maps to")
    floats = {name: np.ascontiguousarray(tensors[name], dtype=np.float32) for name in shapes if name != D2T}
    embed = tensors.get(EMBED_TOKENS)
    return Eagle3HeadWeights(
        tensors=floats,
        d2t=d2t,
        t2d=t2d,
        embed_tokens=None if embed is None else np.asarray(embed, dtype=np.float32),
    )


def load_head_weights(folder: str | Path, config: Eagle3HeadConfig | None = None) -> Eagle3HeadWeights:
    """Read and check a head folder's weights (``config`` defaults to the folder's ``config.json``)."""
    config = config or Eagle3HeadConfig.from_folder(folder)
    return check_head_tensors(read_head_tensors(folder), config, source=str(folder))
