"""Greedy parity against llama.cpp on a real GGUF (TESTING.md's rule for quantized files): vllmx's
greedy tokens teacher-forced through llama.cpp's batched evaluation, every position within 1.5
nats of llama.cpp's best and at least 95% equal to its argmax."""

from __future__ import annotations

import os

import numpy as np

from tests.models.parity import check_positions, log_softmax

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
DELTA, MIN_STRICT = 1.5, 0.95


def load_pair(path: str):
    """(vllmx LLM, llama.cpp Llama with logits for every position) on the same file."""
    import llama_cpp

    from vllmx import LLM

    return (LLM(path, max_model_len=512),
            llama_cpp.Llama(path, n_ctx=512, n_threads=os.cpu_count(), logits_all=True,
                            verbose=False))


def llamacpp_positions(ref, prompt: list[int], toks: list[int]):
    """llama.cpp's logits (f64, one row per position of prompt + toks) and the check of each
    generated token against them (TESTING.md's quantized-file rule, DELTA)."""
    ref.reset()
    ref.eval(list(prompt) + list(toks))
    logits = np.asarray(ref.scores[: len(prompt) + len(toks)], dtype=np.float64)
    return check_positions(log_softmax(logits)[len(prompt) - 1: -1], toks, DELTA), logits


def check_greedy_parity(llm, ref, max_tokens: int = 32) -> None:
    """Every prompt of the pool (20 x 32 positions): about 3-4% of greedy positions on these
    quantized models are near-ties that llama.cpp itself does not resolve consistently (its
    own incremental tokens against its batched logits), so over a seed's draw of 8 the 95% bar
    passed or failed by the draw (242/256 and 364/384 on some seeds); over the whole pool the
    fraction is the model's, not the draw's."""
    from vllmx import SamplingParams

    outs = llm.generate(POOL, SamplingParams(temperature=0, max_tokens=max_tokens,
                                             ignore_eos=True))
    strict = total = 0
    for prompt, out in zip(POOL, outs):
        ids, toks = out.prompt_token_ids, out.outputs[0].token_ids
        assert len(toks) == max_tokens
        report, _ = llamacpp_positions(ref, ids, toks)
        assert report.failed == 0, f"{prompt!r}: {report}"
        strict, total = strict + report.strict, total + len(toks)
    assert strict >= MIN_STRICT * total, f"only {strict}/{total} positions strict"
