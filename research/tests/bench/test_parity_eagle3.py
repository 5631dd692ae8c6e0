"""`python -m research.bench.parity --drafter eagle3`: xpuspec's EAGLE-3 beside GenAI's on one head.

Split from tests/bench/test_genai_eagle3.py (the conversion and the bench rows stay there); the same
4-layer target with a random head tapping boundaries (1, 2, 3), which GenAI can run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("optimum.exporters.openvino")
pytest.importorskip("openvino_genai")

from research.training.eagle3_torch import random_head, save_head  # noqa: E402
from tests.support.tiny_checkpoints import make_tiny_checkpoint  # noqa: E402
from xpuspec.model_bundle import ModelBundle  # noqa: E402

TAPS = (1, 2, 3)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> ModelBundle:
    from xpuspec.prepare import PrepareConfig, prepare_bundle

    work = tmp_path_factory.mktemp("genai_eagle3")
    target = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=4, seed=0)
    config = json.loads((target / "config.json").read_text())
    module, head_config = random_head(config, 96, seed=5, aux_layer_ids=TAPS)
    head = save_head(module, head_config, work / "head")
    prepared = PrepareConfig(target=str(target), eagle3=str(head), output=work / "b", weights="fp16")
    return ModelBundle.open(prepare_bundle(prepared))


def test_parity_runs_both_engines_with_the_head(bundle: ModelBundle, capsys) -> None:
    """`python -m research.bench.parity --drafter eagle3`: xpuspec's EAGLE-3 and GenAI's on the same head."""
    from research.bench import parity

    arguments = ["--bundle", str(bundle.root), "--drafter", "eagle3", "--draft-lengths", "0,2"]
    arguments += ["--prompts", "1", "--max-tokens", "4", "--rounds", "1", "--workload", "chat"]
    assert parity.main(arguments) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["target-only", "γ=2"]
    assert all("÷ GenAI best" in line for line in lines)


def test_parity_refuses_a_head_genai_cannot_run(eagle3_bundle: Path) -> None:
    from research.bench import parity

    arguments = [
        "--bundle",
        str(eagle3_bundle),
        "--drafter",
        "eagle3",
        "--draft-lengths",
        "2",
        "--rounds",
        "1",
    ]
    with pytest.raises(SystemExit, match="GenAI cannot run the EAGLE-3 head: the head cannot run on GenAI"):
        parity.main(arguments + ["--prompts", "1", "--max-tokens", "4"])
