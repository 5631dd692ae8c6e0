"""The tree options at the edges: `xpuspec generate --draft-tree`, the server's `draft_tree` field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from xpuspec.cli import main
from xpuspec.sample.draft_tree import TreeShape, parse_draft_tree_text
from xpuspec.server.choices import sampling_params
from xpuspec.server.schemas import CompletionRequest

pytestmark = pytest.mark.slow


def test_generate_with_a_tree_reports_it(pair_bundle, capsys):
    args = ["generate", "--bundle", str(pair_bundle), "def add(a, b):", "--raw", "--max-tokens", "16"]
    code = main(
        args + ["--ignore-eos", "--draft-tree", "3,2,6", "--property", "INFERENCE_PRECISION_HINT=f32"]
    )
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("def add(a, b):")
    summary = err.strip().splitlines()[-1]
    assert "tree 3,2,6" in summary and "nodes" in summary and "tokens per target pass" in summary


def test_bad_draft_tree_argument_is_a_usage_error(pair_bundle, capsys):
    code = main(["generate", "--bundle", str(pair_bundle), "x", "--draft-tree", "4,2"])
    assert code == 2
    assert "--draft-tree" in capsys.readouterr().err
    assert parse_draft_tree_text("auto") == "auto" and parse_draft_tree_text("none") is None


def test_server_field_reaches_the_sampling_params():
    body = CompletionRequest(model="m", prompt="x", draft_tree={"depth": 3, "width": 2, "nodes": 6})
    assert sampling_params(body, 8, None, 0).draft_tree == TreeShape(3, 2, 6)
    assert (
        sampling_params(CompletionRequest(model="m", prompt="x", draft_tree="auto"), 8, None, 0).draft_tree
        == "auto"
    )
    with pytest.raises(ValidationError, match="draft_tree"):
        CompletionRequest(model="m", prompt="x", draft_tree={"depth": 3})


def test_a_request_gets_its_tree_from_a_pipeline_without_a_default_tree(pair_bundle):
    """Default CPU properties and no default tree: the per-request field still works."""
    from xpuspec import Pipeline, SamplingParams

    pipe = Pipeline(pair_bundle, drafter="draft", use_placement=False)
    assert pipe.target_runner.supports_trees and pipe.engine.tree_drafter is not None
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, draft_tree=TreeShape(3, 2, 6))
    assert pipe.generate(["def add(a, b):"], params)[0].stats["tree_verifications"] > 0
    assert Pipeline(pair_bundle, drafter="ngram", use_placement=False).engine.tree_drafter is None


def test_metrics_expose_tree_figures(pair_bundle):
    """A request's tree figures, from a real tree run, reach the Prometheus exposition."""
    from xpuspec import Pipeline, SamplingParams
    from xpuspec.api.engine_loop import EngineSnapshot
    from xpuspec.server.metrics import ServerMetrics

    pipe = Pipeline(pair_bundle, drafter="draft", properties="exact")
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, draft_tree=TreeShape(3, 2, 6))
    request_id = pipe._add("def add(a, b):", params)
    stats = None
    while stats is None:
        for output in pipe.engine.step():
            if output.request_id == request_id and output.finished:
                stats = output.stats
    metrics = ServerMetrics(lambda: EngineSnapshot(), lambda: 0)
    metrics.record_finished(5, stats, "length")
    text = metrics.render().decode()
    assert f"xpuspec_spec_tree_verifications_total {float(stats.tree_verifications)}" in text
    assert f"xpuspec_spec_tree_nodes_verified_total {float(stats.tree_nodes_verified)}" in text
    assert stats.tree_verifications > 0 and stats.tree_nodes_verified > stats.tree_verifications
    assert 'xpuspec_spec_tree_accepted_depth_total{depth="0"}' in text or "depth=" in text
    per_pass = (stats.accepted + stats.verification_steps) / stats.verification_steps
    assert f"xpuspec_spec_accepted_tokens_per_target_pass {per_pass}" in text


def test_auto_tree_requests_start_from_the_pooled_acceptance_as_chains_do(pair_bundle):
    """Whichever choice asks first fixes a request's acceptance prior: an "auto" request, asked by
    the tree policy, must get the rate pooled over the engine's drafts, as an adaptive chain does,
    not the fixed prior (which had "auto" requests drafting chains where adaptive γ drafted none)."""
    from xpuspec import Pipeline, SamplingParams

    pipe = Pipeline(pair_bundle, drafter="draft", use_placement=False)
    engine = pipe.engine
    for request_id, tree in (("auto", "auto"), ("chain", None)):
        # Enough tokens to outlast 3 steps, decode bursts included.
        params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True, draft_tree=tree)
        engine.add_request(request_id, pipe.encode("def add(a, b):"), params)
    for _ in range(3):
        engine.step()
    assert engine.has_unfinished()
    for request_id in ("auto", "chain"):
        assert engine.policy.acceptance.tracker(request_id).pool is engine.policy.acceptance.pool, request_id
