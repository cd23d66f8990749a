"""Unsupported GGUF vocabularies fail loudly, naming what is unsupported."""

from __future__ import annotations

import pytest

from vllmx.tokenizer import Tokenizer, build_gguf_tokenizer


def _tiny_bpe_meta(**overrides):
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": ["<|endoftext|>", "a", "b", "ab", "Ġ", "Ġab"],
        "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b", "Ġ ab"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }
    meta.update(overrides)
    return meta


def test_unknown_model():
    with pytest.raises(ValueError, match="'bert-wordpiece-xyz'"):
        Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.model": "bert-wordpiece-xyz"}))


def test_unknown_pre():
    with pytest.raises(ValueError, match="'my-new-pretok'"):
        Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": "my-new-pretok"}))


def test_missing_vocab():
    meta = _tiny_bpe_meta()
    del meta["tokenizer.ggml.tokens"]
    with pytest.raises(ValueError, match="tokens"):
        Tokenizer.from_gguf_metadata(meta)


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2", "smollm", "deepseek-llm", "deepseek-coder",
                                 "deepseek-v3", "tekken", "gpt-4o", "qwen35"])
def test_known_pres_build(pre):
    t = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": pre}))
    assert t.decode(t.encode("ab ab", add_special_tokens=False)) == "ab ab"
    assert t.encode("<|endoftext|>", add_special_tokens=False) == [0]


def test_add_bos_eos_flags():
    t = Tokenizer.from_gguf_metadata(
        _tiny_bpe_meta(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    )
    assert t.encode("ab") == [0, 3, 0]
    assert t.encode("ab", add_special_tokens=False) == [3]


def test_named_chat_templates():
    v = build_gguf_tokenizer(
        _tiny_bpe_meta(**{"tokenizer.chat_template": "D", "tokenizer.chat_template.tool_use": "T"})
    )
    assert v.chat_template == {"default": "D", "tool_use": "T"}


def test_spm_add_space_prefix_false(spm_gguf):
    import gguf

    from vllmx.loader.gguf_metadata import read_gguf_metadata

    meta = read_gguf_metadata(gguf.GGUFReader(str(spm_gguf)))
    on = Tokenizer.from_gguf_metadata(meta)
    off = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.add_space_prefix": False})
    assert on.convert_ids_to_tokens(on.encode("hello", add_special_tokens=False))[0].startswith("\u2581")
    assert not off.convert_ids_to_tokens(off.encode("hello", add_special_tokens=False))[0].startswith("\u2581")
    assert off.decode(off.encode("hello world", add_special_tokens=False)) == "hello world"
    assert on.decode(on.encode("hello world", add_special_tokens=False)) == "hello world"
