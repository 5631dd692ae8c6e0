"""`python -m research.bench.tree_compare`: every configuration runs, trees verify nodes, passes add up."""

from __future__ import annotations

import pytest

from research.bench import tree_compare

pytestmark = pytest.mark.slow


def test_each_configuration_reports_tokens_per_pass_and_trees_draft_nodes(capsys):
    arguments = ["--bundle", "demo", "--prompts", "1", "--max-tokens", "8", "--rounds", "1"]
    assert tree_compare.main(arguments) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line[:14].strip(): line[14:].split() for line in lines[1:]}
    assert list(rows) == list(tree_compare.CONFIGURATIONS)
    assert float(rows["target-only"][0]) == pytest.approx(1.0)  # one token per pass without drafts
    for name, (tokens_per_pass, _nodes_per_tree, ratio, tokens_per_second) in rows.items():
        assert 1.0 <= float(tokens_per_pass) <= 11.0, name
        assert float(ratio) > 0 and float(tokens_per_second) > 0, name
    assert float(rows["tree 3,2,6"][1]) > 1.0  # fixed shapes verify trees of several nodes
    assert float(rows["chain γ=2"][1]) == 0.0  # chains verify no tree


def test_concurrent_batches_count_every_request(capsys):
    arguments = [
        "--bundle",
        "demo",
        "--prompts",
        "2",
        "--max-tokens",
        "6",
        "--rounds",
        "1",
        "--concurrency",
        "3",
    ]
    assert tree_compare.main(arguments) == 0
    rows = {line[:14].strip(): line[14:].split() for line in capsys.readouterr().out.strip().splitlines()[1:]}
    assert list(rows) == list(tree_compare.CONFIGURATIONS)
    # Passes are counted per request, so target-only still gives exactly one token per pass.
    assert float(rows["target-only"][0]) == pytest.approx(1.0)
    assert float(rows["tree 3,2,6"][1]) > 1.0


def test_unknown_configurations_are_refused(capsys):
    with pytest.raises(SystemExit):
        tree_compare.main(["--configurations", "tree 9,9,9"])
    assert "unknown configurations ['tree 9,9,9']" in capsys.readouterr().err


def test_bad_counts_are_refused():
    with pytest.raises(SystemExit):
        tree_compare.main(["--rounds", "0"])
    with pytest.raises(SystemExit):
        tree_compare.main(["--concurrency", "0"])


def test_drafters_are_compared_row_by_row(eagle3_bundle, capsys):
    """The draft model and the EAGLE-3 head, each with a chain and a tree, against one target-only."""
    arguments = ["--bundle", str(eagle3_bundle), "--prompts", "1", "--max-tokens", "8", "--rounds", "1"]
    arguments += ["--drafters", "draft,eagle3", "--configurations", "chain γ=2;tree 3,2,6"]
    assert tree_compare.main(arguments) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    width = lines[0].index("tokens/pass")
    rows = {line[:width].strip(): line[width:].split() for line in lines[1:]}
    expected = ["target-only", "draft chain γ=2", "draft tree 3,2,6", "eagle3 chain γ=2", "eagle3 tree 3,2,6"]
    assert list(rows) == expected
    assert float(rows["target-only"][0]) == pytest.approx(1.0)
    for drafter in ("draft", "eagle3"):
        assert float(rows[f"{drafter} tree 3,2,6"][1]) > 1.0  # each drafter's trees were verified
        assert float(rows[f"{drafter} chain γ=2"][1]) == 0.0


def test_unknown_drafters_are_refused(capsys):
    with pytest.raises(SystemExit):
        tree_compare.main(["--drafters", "draft,ngram"])
    assert "--drafters takes names among ['draft', 'eagle3']" in capsys.readouterr().err
