"""EAGLE-3 drafting as the engine sees it: plain modules (neither OpenVINO nor torch loaded, no import
cycle between chains and trees), the capabilities it declares, and the draft mask it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np

from xpuspec.core.interfaces import DrafterCaps
from xpuspec.spec_decode.eagle3.proposer import Eagle3Proposer
from xpuspec.spec_decode.eagle3.tree import Eagle3TreeDrafter


def _loaded_after(code: str, names: tuple[str, ...]) -> list[str]:
    script = (
        f"import json, sys\n{code}\nprint(json.dumps([n for n in {list(names)!r} if n in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def test_drafting_modules_import_neither_openvino_nor_torch() -> None:
    code = "import xpuspec.spec_decode.eagle3.proposer, xpuspec.spec_decode.eagle3.tree\n"
    code += "import xpuspec.spec_decode.eagle3.weights"
    assert _loaded_after(code, ("openvino", "torch")) == []


def test_the_tree_drafter_does_not_import_the_chain_proposer() -> None:
    loaded = _loaded_after("import xpuspec.spec_decode.eagle3.tree", ("xpuspec.spec_decode.eagle3.proposer",))
    assert loaded == []


def _proposer() -> Eagle3Proposer:
    head = SimpleNamespace(config=SimpleNamespace(vocab_size=8))
    return Eagle3Proposer(head, lambda: np.zeros((0, 3)), 8)  # type: ignore[arg-type]


def test_caps_say_what_the_engine_must_do_for_eagle3() -> None:
    proposer = _proposer()
    assert proposer.caps == DrafterCaps(
        needs_every_target_state=True,
        drafts_trees=True,
        constraint_aware=True,
        overlappable=False,
        is_draft_model=False,
        shares_block_tables=False,
    )
    tree = proposer.tree_drafter()
    assert isinstance(tree, Eagle3TreeDrafter) and tree.states is proposer.states  # one shared state
    proposer.warm_up(128)  # nothing to do, and says so by returning


def test_the_draft_mask_is_set_by_method() -> None:
    proposer = _proposer()

    def mask(request_id: str, drafted: list[int], logits: np.ndarray) -> np.ndarray:
        return logits

    assert not hasattr(proposer, "constrain_logits")  # the engine's old attribute hand-off is gone
    proposer.set_draft_mask(mask)
    assert proposer._draft_mask is mask
