"""`xpuspec prepare TARGET --eagle3 HEAD_DIR`: check an EAGLE-3 head against the target, put it in the bundle.

The runtime reads heads in the published Hugging Face layout (:mod:`xpuspec.spec_decode.eagle3`), so the
bundle keeps that layout, in one canonical form::

    BUNDLE/eagle3/config.json         the head's own config, as published
    BUNDLE/eagle3/model.safetensors   its tensors with their dtypes: a single file copied as it is,
                                      shards merged, a pytorch_model.bin converted (needs torch)

Checked before anything is written: the config (one decoder layer, the features the runtime computes),
every tensor's name and shape and the draft-to-target vocabulary map
(:func:`xpuspec.spec_decode.eagle3.weights.check_head_tensors`), and the head against the target: hidden
size, vocabulary and the target layers it taps (:meth:`Eagle3HeadConfig.check_target`), read from the
manifest's shape facts of the target, which HF and GGUF targets both record.

The manifest's ``eagle3`` section names the folder, the tapped layers and the draft vocabulary; the two
files are hashed with the others, so bundle verification covers the head.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from xpuspec.prepare.config import PrepareError
from xpuspec.spec_decode.eagle3.config import ARCHITECTURE, CONFIG_FILE, Eagle3HeadConfig
from xpuspec.spec_decode.eagle3.weights import (
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX,
    TORCH_FILE,
    check_head_tensors,
    decode_tensor,
    read_head_tensors,
    read_safetensors,
)

logger = logging.getLogger(__name__)

HEAD_FOLDER = "eagle3"
_ADVICE = "use a head trained for this target (its config.json names the target's sizes)"
# torch dtype name -> safetensors dtype, for converting a pytorch_model.bin without the safetensors package.
_TORCH_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
RawTensor = tuple[str, list[int], bytes]  # safetensors dtype, shape, little-endian bytes


def target_shape(facts: Mapping[str, Any]) -> dict[str, int]:
    """What the head check reads of a target, from the manifest's model facts (HF or GGUF)."""
    try:
        return {
            "hidden_size": int(facts["hidden_size"]),
            "vocab_size": int(facts["vocab_size"]),
            "num_hidden_layers": int(facts["num_layers"]),
        }
    except (KeyError, TypeError, ValueError) as error:
        raise PrepareError(
            f"the target's facts lack its hidden size, vocabulary or layer count ({error}); "
            "prepare the target again with this xpuspec"
        ) from None


def head_folder(spec: str | Path) -> Path:
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise PrepareError(
            f"--eagle3 {spec}: no such folder; give a local EAGLE-3 head folder "
            f"({CONFIG_FILE} and {SAFETENSORS_FILE}, as published heads ship)"
        )
    return folder.resolve()


def check_head_fits(
    spec: str | Path, target_facts: Mapping[str, Any]
) -> tuple[Eagle3HeadConfig, tuple[int, ...]]:
    """The head's config and the target layers it taps; :class:`PrepareError` when it does not fit."""
    folder = head_folder(spec)
    try:
        config = Eagle3HeadConfig.from_folder(folder)
    except ValueError as error:
        raise PrepareError(f"--eagle3 {spec}: {error}") from None
    try:
        taps = config.check_target(target_shape(target_facts))
    except ValueError as error:
        raise PrepareError(f"--eagle3 {spec}: {error}; {_ADVICE}") from None
    return config, tuple(taps)


def write_head(spec: str | Path, bundle_dir: Path, target_facts: Mapping[str, Any]) -> dict[str, Any]:
    """Check the head and write it to ``bundle_dir/eagle3``; return the manifest's ``eagle3`` section."""
    folder = head_folder(spec)
    config, taps = check_head_fits(folder, target_facts)
    try:
        weights = check_head_tensors(read_source_tensors(folder), config, source=f"--eagle3 {spec}")
    except ValueError as error:
        raise PrepareError(
            str(error) if str(error).startswith("--eagle3") else f"--eagle3 {spec}: {error}"
        ) from None
    out = bundle_dir / HEAD_FOLDER
    out.mkdir()
    shutil.copyfile(folder / CONFIG_FILE, out / CONFIG_FILE)
    source_format = _write_weights(folder, out / SAFETENSORS_FILE)
    if source_format != SAFETENSORS_FILE:  # a file this module wrote: read it back as the runtime will
        check_head_tensors(read_safetensors(out / SAFETENSORS_FILE), config, source=str(out))
    logger.info(
        "EAGLE-3 head %s: target layers %s, draft vocabulary %d", folder, taps, config.draft_vocab_size
    )
    return {
        "path": HEAD_FOLDER,
        "source": str(folder),
        "source_format": source_format,
        "architecture": ARCHITECTURE,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "aux_layer_ids": list(config.aux_layer_ids) if config.aux_layer_ids is not None else None,
        "tap_layers": list(taps),
        "num_parameters": int(sum(tensor.size for tensor in weights.tensors.values())),
        "size_bytes": (out / SAFETENSORS_FILE).stat().st_size,
    }


def read_source_tensors(folder: Path) -> dict[str, np.ndarray]:
    """The tensors of a head folder as published: the runtime's safetensors reader, or a
    ``pytorch_model.bin`` read through torch (only here: the runtime reads no torch pickle)."""
    if not (folder / SAFETENSORS_INDEX).is_file() and not (folder / SAFETENSORS_FILE).is_file():
        if (folder / TORCH_FILE).is_file():
            return {
                name: decode_tensor(dtype, shape, data, f"{folder / TORCH_FILE}: tensor {name!r}")
                for name, (dtype, shape, data) in _raw_torch(folder / TORCH_FILE).items()
            }
    return read_head_tensors(folder)


def _write_weights(folder: Path, destination: Path) -> str:
    """One ``model.safetensors`` from whichever weight files the head has; returns the source's name."""
    if (folder / SAFETENSORS_INDEX).is_file():
        weight_map = json.loads((folder / SAFETENSORS_INDEX).read_text(encoding="utf-8"))["weight_map"]
        merged: dict[str, RawTensor] = {}
        for shard in sorted(set(weight_map.values())):
            merged.update(_raw_safetensors(folder / shard))
        write_safetensors(destination, merged)
        return SAFETENSORS_INDEX
    if (folder / SAFETENSORS_FILE).is_file():
        shutil.copyfile(folder / SAFETENSORS_FILE, destination)
        return SAFETENSORS_FILE
    write_safetensors(destination, _raw_torch(folder / TORCH_FILE))
    return TORCH_FILE


def _raw_safetensors(path: Path) -> dict[str, RawTensor]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = data[8 + length :]
    return {
        name: (
            entry["dtype"],
            list(entry["shape"]),
            body[entry["data_offsets"][0] : entry["data_offsets"][1]],
        )
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _raw_torch(path: Path) -> dict[str, RawTensor]:
    try:
        import torch
    except ImportError:
        raise PrepareError(
            f"--eagle3: {path} is a torch pickle and torch is not installed: install the `convert` extra, "
            f"or convert the head to {SAFETENSORS_FILE} on a machine with torch"
        ) from None
    state = torch.load(path, map_location="cpu", weights_only=True)
    tensors = {}
    for name, tensor in state.items():
        dtype = _TORCH_DTYPES.get(str(tensor.dtype).removeprefix("torch."))
        if dtype is None:
            raise PrepareError(
                f"--eagle3: {path}: tensor {name!r} has dtype {tensor.dtype}, which cannot be kept"
            )
        tensor = tensor.detach().contiguous().cpu()
        # numpy has no bfloat16: its bytes travel as int16.
        array = (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy()
        tensors[name] = (dtype, list(tensor.shape), array.astype(array.dtype.newbyteorder("<")).tobytes())
    return tensors


def write_safetensors(path: Path, tensors: Mapping[str, RawTensor]) -> None:
    """The safetensors format: u64 header length, a JSON header (padded to 8 bytes), the raw bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(text)))
        stream.write(text)
        for name in sorted(tensors):
            stream.write(tensors[name][2])
