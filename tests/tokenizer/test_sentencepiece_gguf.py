"""SentencePiece ('llama') GGUF vocabularies: a tiny trained BPE model with byte fallback,
compared with transformers loading the same GGUF and with sentencepiece itself."""

from __future__ import annotations

import pytest

from conftest import SPM_CHAT_TEMPLATE

TEXTS = [
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "  two leading spaces",
    "multiple   spaces   between",
    "trailing  ",
    "numbers 12345 and 3.14159",
    "unseen chars: € ß Ω жук",
    "漢字とかな 🙂🚀",
    "tabs\tand\nnewlines\n\nend",
    "mixed <think>reasoning</think> answer",
    "<s>literal bos</s> text",
    "UPPER lower MiXeD",
]


@pytest.fixture(scope="module")
def spm_pair(spm_gguf):
    transformers = pytest.importorskip("transformers")
    import gguf

    from vllmx.loader.gguf_metadata import read_gguf_metadata
    from vllmx.tokenizer import Tokenizer

    meta = read_gguf_metadata(gguf.GGUFReader(str(spm_gguf)))
    mine = Tokenizer.from_gguf_metadata(meta)
    theirs = transformers.AutoTokenizer.from_pretrained(str(spm_gguf.parent), gguf_file=spm_gguf.name)
    return mine, theirs


@pytest.mark.parametrize("text", TEXTS)
def test_spm_encode_matches_transformers(spm_pair, text):
    mine, theirs = spm_pair
    for add in (True, False):
        assert mine.encode(text, add_special_tokens=add) == theirs.encode(text, add_special_tokens=add)


@pytest.mark.parametrize("text", TEXTS)
def test_spm_decode_matches_transformers(spm_pair, text):
    mine, theirs = spm_pair
    ids = mine.encode(text)
    assert mine.decode(ids) == theirs.decode(ids)
    assert mine.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    toks = mine.convert_ids_to_tokens(ids)
    assert toks == theirs.convert_ids_to_tokens(ids)
    assert mine.convert_tokens_to_string(toks) == theirs.convert_tokens_to_string(toks)


# sentencepiece itself isolates a run of "▁" before a word ("  x" -> "▁", "▁", "x"...), which neither
# transformers' BPE nor llama.cpp's SPM tokenizer do; those texts are compared with transformers only.
@pytest.mark.parametrize("text", [t for t in TEXTS if "<" not in t and not t.startswith(" ")])
def test_spm_matches_sentencepiece(spm_pair, spm_model, text):
    mine, _ = spm_pair
    assert mine.encode(text, add_special_tokens=False) == spm_model.encode(text)
    assert mine.decode(mine.encode(text, add_special_tokens=False)) == text


def test_spm_byte_fallback(spm_pair, spm_model):
    mine, _ = spm_pair
    ids = mine.encode("€", add_special_tokens=False)
    toks = mine.convert_ids_to_tokens(ids)
    assert "<0xE2>" in toks and "<0x82>" in toks and "<0xAC>" in toks
    assert mine.decode(ids) == "€"


def test_spm_properties(spm_pair):
    mine, theirs = spm_pair
    assert mine.bos_token_id == theirs.bos_token_id == 1
    assert mine.eos_token_id == theirs.eos_token_id == 2
    assert mine.unk_token_id == 0
    assert mine.vocab_size == len(theirs)
    assert mine.encode("hi")[0] == 1  # add_bos_token
    assert set(theirs.all_special_ids) <= set(mine.all_special_ids)
    assert mine.chat_template == SPM_CHAT_TEMPLATE == theirs.chat_template
    # user-defined tokens stay whole and are not special
    think = mine.convert_tokens_to_ids("<think>")
    assert think in mine.encode("a <think> b") and think not in mine.all_special_ids


def test_spm_chat_template(spm_pair):
    mine, theirs = spm_pair
    conv = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    for agp in (False, True):
        assert mine.apply_chat_template(conv, add_generation_prompt=agp, tokenize=False) == (
            theirs.apply_chat_template(conv, add_generation_prompt=agp, tokenize=False)
        )
        assert mine.apply_chat_template(conv, add_generation_prompt=agp) == (
            theirs.apply_chat_template(conv, add_generation_prompt=agp, return_dict=False)
        )


def test_generate_merges_matches_transformers(spm_model):
    pytest.importorskip("transformers")
    from transformers.tokenization_utils_base import generate_merges as hf_generate_merges

    from vllmx.tokenizer.gguf_vocab import generate_merges

    n = spm_model.get_piece_size()
    tokens = [spm_model.id_to_piece(i) for i in range(n)]
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = {t: spm_model.get_score(i) for i, t in enumerate(tokens)}
    assert generate_merges(vocab, scores) == hf_generate_merges(vocab, scores)
