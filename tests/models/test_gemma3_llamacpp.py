"""Gemma-3-270M Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0 weights; sliding-window layers; 262k
SentencePiece vocabulary) against llama.cpp on the same file: identical tokenizer ids, and greedy
tokens within 1.5 nats of llama.cpp's best at every position, >= 95% equal to its argmax."""

from __future__ import annotations

import pytest

from tests.models.llamacpp_parity import POOL, check_greedy_parity, load_pair

pytest.importorskip("llama_cpp")

@pytest.fixture(scope="module")
def models(gemma3_gguf):
    return load_pair(gemma3_gguf)


def test_tokenizer_ids_match_llamacpp(models):
    llm, ref = models
    tok = llm.get_tokenizer()
    for text in POOL + ["  leading spaces", "tabs\tand\nnewlines\n\n", "emoji 🎉 and 日本語",
                        "<start_of_turn>user\nhi<end_of_turn>\n", "numbers 1234567 3.14159",
                        "   ", "trailing space ", "\u00a0nbsp and ｆｕｌｌｗｉｄｔｈ", "a\n\n\n\nb",
                        "Straße ŝ ñ 🤖🤖 ﷽", "<unused0> <mask> [@BOS@]"]:
        for bos in (False, True):  # Gemma adds <bos> by default
            ours = tok.encode(text, add_special_tokens=bos)
            theirs = ref.tokenize(text.encode(), add_bos=bos, special=True)
            assert ours == theirs, (text, bos)


def test_greedy_parity_with_llamacpp(models):
    check_greedy_parity(*models)
