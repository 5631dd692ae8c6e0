"""`python -m research.bench.parity --drafter eagle3`: xpuspec's EAGLE-3 beside GenAI's on one head.

Split from tests/bench/test_genai_eagle3.py (the conversion and the bench rows stay there); the same
4-layer target with a random head tapping boundaries (1, 2, 3), which GenAI can run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("optimum.exporters.openvino")
pytest.importorskip("openvino_genai")

from tests.support.eagle3_bundles import tiny_eagle3_bundle  # noqa: E402
from xpuspec.models.bundle import ModelBundle  # noqa: E402

TAPS = (1, 2, 3)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> ModelBundle:
    return ModelBundle.open(tiny_eagle3_bundle(tmp_path_factory.mktemp("genai_eagle3"), TAPS))


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
