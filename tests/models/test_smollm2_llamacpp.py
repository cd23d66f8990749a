"""SmolLM2-135M-Instruct Q4_1 against llama.cpp on the same file: identical tokenizer ids, and greedy
tokens within 1.5 nats of llama.cpp's best at every position, >= 95% equal to its argmax."""

from __future__ import annotations

import pytest

from tests.models.llamacpp_parity import POOL, check_greedy_parity, load_pair

pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def models(smollm2_gguf):
    return load_pair(smollm2_gguf)


def test_tokenizer_ids_match_llamacpp(models):
    llm, ref = models
    tok = llm.get_tokenizer()
    for text in POOL + ["  leading spaces", "tabs\tand\nnewlines\n\n", "emoji 🎉 and 日本語",
                        "<|im_start|>user\nhi<|im_end|>", "numbers 1234567 3.14159"]:
        ours = tok.encode(text)
        theirs = ref.tokenize(text.encode(), add_bos=False, special=True)
        assert ours == theirs, text


def test_greedy_parity_with_llamacpp(models):
    check_greedy_parity(*models)
