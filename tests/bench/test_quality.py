"""The quality measure (xpuspec.bench.quality*): its arithmetic, the exact reference against itself, a
degraded model scoring worse, the command's table, JSON and manifest record, and llama.cpp's row where a
llama-server is built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from xpuspec.bench import llama_cpp
from xpuspec.bench.quality import Candidate, QualityConfig, heldout_text, text_chunks
from xpuspec.bench.quality_math import kl_divergence, log_softmax, lumped_kl, top_support
from xpuspec.bench.quality_run import REFERENCE_ROW, LlamaChoice, run_quality
from xpuspec.cli import main
from xpuspec.executor.properties import EXACT_PROPERTIES
from xpuspec.models.bundle import ModelBundle

SMALL = QualityConfig(chunk_tokens=64, max_chunks=4, speed_rounds=1, speed_prompt_tokens=16, speed_tokens=4)


def _rows(report):
    return {row.label: row.deviation.figures() for row in report.rows}


def test_the_text_set_is_several_thousand_characters_of_varied_kinds():
    passages = heldout_text()
    kinds = {passage.kind for passage in passages}
    assert {"prose", "code_python", "dialogue", "numbers", "russian", "cjk"} <= kinds
    assert sum(len(passage.text) for passage in passages) > 10_000


def test_kl_of_identical_rows_is_zero_and_lumping_never_increases_it():
    rng = np.random.default_rng(0)
    reference = log_softmax(rng.normal(size=(50, 300)))
    candidate = log_softmax(rng.normal(size=(50, 300)) * 0.5 + np.exp(reference))
    assert np.all(kl_divergence(reference, reference) == 0)
    actual = rng.integers(0, 300, size=50)
    support = top_support(candidate, actual, 10)
    ids = np.where(support < 0, 0, support)
    on_support = np.where(support < 0, -np.inf, np.take_along_axis(candidate, ids, axis=-1))
    lumped = lumped_kl(reference, support, on_support)
    full = kl_divergence(reference, candidate)
    assert np.all(lumped <= full + 1e-12) and np.all(lumped >= -1e-12)
    # Every row's support holds the actual token once and no id twice.
    for row, token in zip(support, actual, strict=True):
        used = row[row >= 0]
        assert token in used and len(set(used.tolist())) == len(used)


def test_text_chunks_cut_passages_and_keep_every_token(pair_bundle: Path):
    from xpuspec.text import Tokenizer

    tokenizer = Tokenizer(ModelBundle.open(pair_bundle).target.path)
    passages = heldout_text()[:3]
    chunks = text_chunks(tokenizer, passages, 32)
    assert all(2 <= len(chunk) <= 32 for chunk in chunks)
    total = sum(len(tokenizer.encode(p.text, add_special_tokens=False)) for p in passages)
    assert total - 3 <= sum(len(chunk) for chunk in chunks) <= total


def test_the_reference_against_itself_is_exact_and_a_perturbed_copy_is_worse(
    pair_bundle: Path, tmp_path: Path
):
    bundle = ModelBundle.open(pair_bundle)
    assert bundle.draft is not None  # the pair's draft: the target's weights with noise added
    candidates = [
        Candidate("exact again", bundle.target, dict(EXACT_PROPERTIES)),
        Candidate("default", bundle.target),
        Candidate("perturbed copy", bundle.draft, dict(EXACT_PROPERTIES)),
    ]
    report = run_quality(bundle, candidates, SMALL, llama=LlamaChoice(off=True), logs=tmp_path)
    rows = _rows(report)
    for label in (REFERENCE_ROW, "exact again"):
        assert rows[label]["kl_mean"] == pytest.approx(0, abs=1e-9)
        assert rows[label]["kl_p99"] == pytest.approx(0, abs=1e-9)
        assert rows[label]["top1"] == 1.0
    assert rows["exact again"]["perplexity"] == pytest.approx(rows[REFERENCE_ROW]["perplexity"])
    perturbed, default = rows["perturbed copy"], rows["default"]
    assert perturbed["kl_mean"] > 10 * max(default["kl_mean"], 1e-6)
    assert perturbed["kl_top_n_mean"] <= perturbed["kl_mean"]
    assert perturbed["top1"] < 1.0
    assert perturbed["perplexity"] != pytest.approx(rows[REFERENCE_ROW]["perplexity"])
    # No llama-server asked for: the budget is llama.cpp's arithmetic, emulated; the copy is over it.
    assert report.budget is not None and report.budget.source == "emulated"
    assert report.budget.within(perturbed) is False
    assert report.budget.within(rows[REFERENCE_ROW]) is True
    assert all(row.decode_tokens_per_s and row.decode_tokens_per_s > 0 for row in report.rows)


def test_the_command_prints_the_figures_and_records_them(pair_bundle: Path, tmp_path: Path, capsys):
    bundle = tmp_path / "bundle"
    shutil.copytree(pair_bundle, bundle)
    common = ["--chunk-tokens", "64", "--max-chunks", "2", "--speed-rounds", "1", "--no-llama-cpp"]
    assert main(["quality", str(bundle), *common]) == 0
    printed = capsys.readouterr().out
    assert "budget: llama.cpp arithmetic, emulated (emulated in OpenVINO): KL mean <=" in printed
    assert "| exact (reference) |" in printed and "| default |" in printed
    assert "llama.cpp (llama-server): not run: not asked for" in printed

    assert main(["quality", str(bundle), *common, "--properties", "--json", "--write"]) == 0
    record = json.loads(capsys.readouterr().out)
    labels = [row["row"] for row in record["rows"]]
    assert labels[:2] == ["exact (reference)", "default"] and "stable" in labels
    reference = record["rows"][0]
    assert reference["kl_mean"] == 0 and reference["top1"] == 1 and reference["within_budget"] is True
    manifest = json.loads((bundle / "xpuspec.json").read_text())
    assert [row["row"] for row in manifest["quality"]["rows"]] == labels
    assert "decode_tokens_per_s" not in manifest["quality"]["rows"][0]  # speeds belong to the machine
    ModelBundle.open(bundle, verify=True)  # the manifest is not hashed: the bundle still verifies


def test_a_bad_option_is_one_line(capsys):
    assert main(["quality", "demo", "--chunk-tokens", "1"]) == 2
    assert "chunk_tokens must be >= 2" in capsys.readouterr().err


BUILT_LLAMA_SERVER = llama_cpp.find_llama_server()


@pytest.mark.slow
@pytest.mark.skipif(
    BUILT_LLAMA_SERVER is None, reason="no llama-server built (scripts/build-llama-server.sh)"
)
def test_llama_cpp_on_the_same_gguf_is_the_budget(tmp_path: Path):
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import tiny_llama_gguf

    gguf = tiny_llama_gguf(tmp_path)
    assert main(["prepare", str(gguf), "-o", str(tmp_path / "bundle")]) == 0
    bundle = ModelBundle.open(tmp_path / "bundle")
    config = QualityConfig(chunk_tokens=32, max_chunks=2, speed_rounds=0, top_n=5)
    report = run_quality(
        bundle,
        [Candidate("default", bundle.target)],
        config,
        llama=LlamaChoice(binary=BUILT_LLAMA_SERVER, threads=1),
        logs=tmp_path / "logs",
    )
    assert report.not_run == {}
    rows = _rows(report)
    llama = rows["llama.cpp (llama-server)"]
    assert llama["kl_mean"] is None  # top-n only: the lumped KL alone
    assert llama["kl_top_n_mean"] is not None and 0 <= llama["kl_top_n_mean"] < 0.05
    assert llama["top1"] is not None and llama["top1"] > 0.8
    # The same F16 weights: llama.cpp's perplexity is the reference's within a few percent.
    assert llama["perplexity"] == pytest.approx(rows[REFERENCE_ROW]["perplexity"], rel=0.05)
    assert report.budget is not None and report.budget.source == "llama.cpp"
    assert report.budget.kl_key == "kl_top_n_mean"


def test_prepare_quality_prints_and_records_the_figures(tmp_path: Path, capsys, monkeypatch):
    """`prepare --quality` on a tiny GGUF, without a llama-server: the emulated budget, recorded."""
    pytest.importorskip("gguf")
    from tests.support.tiny_gguf import tiny_llama_gguf

    monkeypatch.setenv(llama_cpp.LLAMA_SERVER_ENV, str(tmp_path / "no-llama-server"))
    gguf = tiny_llama_gguf(tmp_path)
    assert main(["prepare", str(gguf), "-o", str(tmp_path / "bundle"), "--quality"]) == 0
    printed = capsys.readouterr().out
    assert "budget: llama.cpp arithmetic, emulated" in printed and "| default |" in printed
    assert "llama.cpp (llama-server): not run: no llama-server" in printed
    quality = ModelBundle.open(tmp_path / "bundle", verify=True).manifest["quality"]
    assert quality["budget"]["source"] == "emulated"
    assert [row["row"] for row in quality["rows"]][:2] == ["exact (reference)", "default"]


@pytest.mark.slow
@pytest.mark.skipif(
    BUILT_LLAMA_SERVER is None, reason="no llama-server built (scripts/build-llama-server.sh)"
)
def test_llama_cpp_gives_every_position_of_cjk_text(smollm2_gguf: Path, tmp_path: Path):
    """SmolLM2 writes CJK characters as byte tokens, which llama-server never sends alone (nor their
    probabilities): every position still gets its top-n and the actual token's log-probability."""
    import httpx

    from xpuspec.bench.quality_llama import peer_chunk

    assert BUILT_LLAMA_SERVER is not None
    text = next(p.text for p in heldout_text() if p.kind == "cjk")
    row = llama_cpp.Row("llama.cpp", "llama.cpp -t 1", ("-t", "1"))
    with llama_cpp.LlamaServer(BUILT_LLAMA_SERVER, smollm2_gguf, row, 256, tmp_path / "log") as server:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            tokens = client.post("/tokenize", json={"content": text[:12]}).json()["tokens"]
            pieces = [client.post("/detokenize", json={"tokens": [t]}).json()["content"] for t in tokens]
            safe = client.post("/tokenize", json={"content": " the"}).json()["tokens"][0]
            found = peer_chunk(client, tokens, 5, safe, 49152)
    assert any("\ufffd" in piece or not piece for piece in pieces[1:])  # a piece of a character
    assert np.all(np.isfinite(found.actual_logprob)) and np.all(found.actual_logprob <= 0)
    assert np.all(found.top1 >= 0) and found.support.shape == (len(tokens) - 1, 6)
