"""The EAGLE-3 drafter of a Pipeline: its head, read once, on the draft device, drafting from the
states the target taps."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuspec.executor.properties import PropertiesArg

if TYPE_CHECKING:
    from xpuspec.executor.eagle3_head import HeadFolder
    from xpuspec.spec_decode.eagle3.proposer import Eagle3Proposer

logger = logging.getLogger(__name__)


def eagle3_proposer(
    head_dir: str | Path | None,
    head: HeadFolder | None,
    target_path: Path,
    device: str,
    properties: PropertiesArg,
    core: Any,
    target_runner: Any,
) -> Eagle3Proposer:
    """The EAGLE-3 head ``head`` (read from ``head_dir`` once, for the target's taps too) compiled for
    ``device``, drafting from ``target_runner``'s tapped states."""
    from xpuspec.executor.eagle3_head import HEAD_WEIGHT_TYPE, Eagle3Head
    from xpuspec.spec_decode.eagle3.proposer import Eagle3Proposer

    if head is None:
        raise ValueError(f"no EAGLE-3 head was read from {head_dir}")

    config = head.config
    head_runtime = Eagle3Head.from_folders(
        head, target_path, device=device, properties=properties, core=core, weight_type=HEAD_WEIGHT_TYPE
    )
    width = target_runner.hidden_state_width
    if width != config.hidden_size:
        raise ValueError(
            f"the target's tapped states have {width} features, the EAGLE-3 head's fc gives "
            f"{config.hidden_size}: it is not this target's head"
        )
    logger.info(
        "EAGLE-3 head %s: target layers %s, draft vocabulary %d",
        head_dir,
        target_runner.hidden_state_layers,
        config.draft_vocab_size,
    )
    return Eagle3Proposer(head_runtime, target_runner.hidden_states, target_runner.vocab_size)
