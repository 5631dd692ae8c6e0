"""The compile half of a paged-attention runner: read the stateful export, turn it into a paged model
and compile it (and its decode lane), with no KV cache yet.

Kept apart from :class:`~xpuspec.executor.paged_runner.PagedModelRunner` so that one model can compile
while another does: the draft's compile needs nothing from the target, only its KV cache does (the
draft shares the target's block tables, sized once the target is compiled). OpenVINO releases the GIL
in ``compile_model``, and a compile keeps about one core busy, so on a machine with two cores or more
the draft compiles beside the target in a thread (:func:`compile_in_background`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openvino as ov

from xpuspec.executor.fused_projections import fuse_shared_input_projections
from xpuspec.executor.graph_edits import cut_logits_vocab, make_paged_model
from xpuspec.executor.hidden_taps import Projection, add_hidden_state_taps

logger = logging.getLogger(__name__)

MODEL_FILE = "openvino_model.xml"


@dataclass(frozen=True)
class PagedCompile:
    """A paged model compiled for one device. ``decode_lane``: a second compiled copy of the same
    graph for one-token steps (see the runner), or None. ``tapped_name``: the output that carries the
    tapped hidden states, or None; ``hidden_state_layers``: the layers tapped, or None."""

    model_dir: Path
    device: str
    main: ov.CompiledModel
    decode_lane: ov.CompiledModel | None
    tapped_name: str | None
    hidden_state_layers: tuple[int, ...] | None


def compile_paged(
    model_dir: Path,
    device: str = "CPU",
    properties: dict | None = None,
    core: ov.Core | None = None,
    decode_lane: bool = False,
    hidden_state_layers: Sequence[int] | None = None,
    logits_vocab: int | None = None,
    hidden_state_projection: Projection | None = None,
    fuse_projections: bool = True,
) -> PagedCompile:
    """Read ``model_dir``'s stateful export, make it paged (taps and a cut LM head as asked), compile it.

    On the CPU, products that share an input are fused first unless ``fuse_projections`` is false
    (:mod:`xpuspec.executor.fused_projections`; GPU plugins fuse these themselves)."""
    model_path = Path(model_dir) / MODEL_FILE
    if not model_path.is_file():
        raise ValueError(f"no {MODEL_FILE} in {model_dir}: expected an optimum-intel stateful export")
    core = core or ov.Core()
    model = make_paged_model(core.read_model(model_path))
    if logits_vocab is not None:
        cut_logits_vocab(model, logits_vocab)
    layers = tapped_name = None
    if hidden_state_layers is not None:
        layers = tuple(int(layer) for layer in hidden_state_layers)
        tapped_name = add_hidden_state_taps(model, layers, hidden_state_projection)
    if fuse_projections and device == "CPU":
        fuse_shared_input_projections(model)
    main = core.compile_model(model, device, dict(properties or {}))
    lane = core.compile_model(model, device, dict(properties or {})) if decode_lane else None
    return PagedCompile(Path(model_dir), device, main, lane, tapped_name, layers)


def compile_in_background(work: Callable[[], PagedCompile]) -> Future[PagedCompile]:
    """Run ``work`` (a :func:`compile_paged` call) in a thread of its own; its errors come out of
    ``result()``. The thread ends with the work: nothing is left running once the result is taken."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xpuspec-compile")
    try:
        return pool.submit(work)
    finally:
        pool.shutdown(wait=False)  # the submitted work still runs to its end
