"""Byte-level BPE from a real GGUF (SmolLM2, pre="smollm") vs transformers on the same file."""

from __future__ import annotations

import pytest

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "trailing space ",
    "multiple   spaces    here",
    "12345",
    "3.14159 and 2.71828, 1000000 and 007",
    "def f(x):\n    return x * 2\n\n\tif x:\n\t\tpass\n",
    "line one\nline two\r\nline three\n\n\n",
    "café naïve résumé Ångström",
    "日本語のテキスト 中文 한국어",
    "emoji 🙂🚀 and 👨‍👩‍👧",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<|im_end|>",
    "don't won't it's we're I'll you've I'd",
    "mixedCASE snake_case kebab-case CONSTANT_CASE",
    "https://example.com/path?q=1&b=2#frag",
    "   \t  \n  ",
    "a\u00a0b\u2003c",  # non-breaking and em spaces
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(smollm_vllmx, smollm_hf, text):
    for add in (True, False):
        assert smollm_vllmx.encode(text, add_special_tokens=add) == smollm_hf.encode(text, add_special_tokens=add)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trip(smollm_vllmx, smollm_hf, text):
    ids = smollm_vllmx.encode(text, add_special_tokens=False)
    assert smollm_vllmx.decode(ids) == text
    assert smollm_vllmx.decode(ids) == smollm_hf.decode(ids)
    assert smollm_vllmx.decode(ids, skip_special_tokens=True) == smollm_hf.decode(ids, skip_special_tokens=True)
    assert smollm_vllmx.convert_ids_to_tokens(ids) == smollm_hf.convert_ids_to_tokens(ids)
    toks = smollm_vllmx.convert_ids_to_tokens(ids)
    assert smollm_vllmx.convert_tokens_to_string(toks) == smollm_hf.convert_tokens_to_string(toks)


def test_properties(smollm_vllmx, smollm_hf):
    t, h = smollm_vllmx, smollm_hf
    assert t.bos_token_id == h.bos_token_id == 1
    assert t.eos_token_id == h.eos_token_id == 2
    assert t.pad_token_id == h.pad_token_id
    assert t.vocab_size == len(h) == 49152
    assert set(h.all_special_ids) <= set(t.all_special_ids)
    assert t.all_special_ids[:3] == [1, 2, 0]
    assert t.chat_template == h.chat_template
    assert t.convert_ids_to_tokens(1) == "<|im_start|>"
    # every control token is special in both
    assert set(h.added_tokens_decoder) == set(t.added_tokens_decoder)


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? Answer in 日本語 🙂"},
    ],
    [{"role": "user", "content": "Write code:\n\tdef f():\n\t    pass"}],
]


@pytest.mark.parametrize("conv", CONVERSATIONS)
@pytest.mark.parametrize("agp", [False, True])
def test_chat_template_matches_transformers(smollm_vllmx, smollm_hf, conv, agp):
    text = smollm_vllmx.apply_chat_template(conv, add_generation_prompt=agp, tokenize=False)
    assert text == smollm_hf.apply_chat_template(conv, add_generation_prompt=agp, tokenize=False)
    ids = smollm_vllmx.apply_chat_template(conv, add_generation_prompt=agp)
    assert ids == smollm_hf.apply_chat_template(conv, add_generation_prompt=agp, tokenize=True, return_dict=False)


def test_continue_final_message_matches_transformers(smollm_vllmx, smollm_hf):
    conv = [{"role": "user", "content": "Count to 3"}, {"role": "assistant", "content": "1, 2,"}]
    mine = smollm_vllmx.apply_chat_template(conv, continue_final_message=True, tokenize=False)
    theirs = smollm_hf.apply_chat_template(conv, continue_final_message=True, tokenize=False)
    assert mine == theirs
    assert mine.endswith("1, 2,")


def test_get_tokenizer_from_meta_and_path(smollm_meta, smollm_gguf, smollm_vllmx):
    from vllmx.tokenizer import get_tokenizer

    a = get_tokenizer(smollm_meta)
    assert a.encode("hi there") == smollm_vllmx.encode("hi there")
    b = get_tokenizer(smollm_gguf)
    assert b.encode("12345 abc") == smollm_vllmx.encode("12345 abc")
