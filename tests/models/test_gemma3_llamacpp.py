"""Gemma-3-270M Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0 weights; sliding-window layers; 262k
SentencePiece vocabulary) against llama.cpp on the same file: identical tokenizer ids, and greedy
tokens within 1.5 nats of llama.cpp's best at every position, >= 95% equal to its argmax."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.parity import check_positions, log_softmax

llama_cpp = pytest.importorskip("llama_cpp")

POOL = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, Neil Armstrong",
    "The best way to learn a new language is",
    "Photosynthesis is the process by which",
    "Here is a list of fruits: apple, banana,",
    "The theory of relativity was developed by",
    "To make a cup of tea, first",
    "import numpy as np\nx = np.",
    "The largest planet in our solar system is",
    "My favourite book is",
    "Question: What is 12 times 7?\nAnswer:",
    "The quick brown fox",
    "SELECT name, age FROM users WHERE",
    "Les élèves ont mangé des crêpes à",
    "The stock market fell sharply today after",
    "A haiku about autumn:\n",
]
# 12 prompts, not 8: on this model about 3% of greedy positions are near-ties (llama.cpp's own
# incremental tokens score 249/256 strict against its batched logits), so with 8 prompts the
# 95% bar would depend on which prompts the seed draws.
NUM_PROMPTS, MAX_TOKENS = 12, 32
SEED = int.from_bytes(os.urandom(4), "little")  # prompts the test does not choose


@pytest.fixture(scope="module")
def models(gemma3_gguf):
    from vllmx import LLM

    vllmx_llm = LLM(gemma3_gguf, max_model_len=512)
    ref = llama_cpp.Llama(gemma3_gguf, n_ctx=512, n_threads=os.cpu_count(), logits_all=True,
                          verbose=False)
    return vllmx_llm, ref


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
    from vllmx import SamplingParams

    llm, ref = models
    rng = np.random.default_rng(SEED)
    prompts = [POOL[i] for i in rng.choice(len(POOL), NUM_PROMPTS, replace=False)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    strict = near = total = 0
    for prompt, out in zip(prompts, outs):
        ids = out.prompt_token_ids
        toks = out.outputs[0].token_ids
        assert len(toks) == MAX_TOKENS
        ref.reset()
        ref.eval(ids + toks)
        logits = np.asarray(ref.scores[: len(ids) + len(toks)], dtype=np.float64)
        report = check_positions(log_softmax(logits)[len(ids) - 1: -1], toks, 1.5)
        assert report.failed == 0, f"{prompt!r} (seed {SEED}): {report}"
        strict, near, total = strict + report.strict, near + report.near_tie, total + len(toks)
    assert strict >= 0.95 * total, f"only {strict}/{total} positions strict (seed {SEED})"
