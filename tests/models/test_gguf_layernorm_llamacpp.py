"""GGUF archs gptneox, stablelm, starcoder2, gpt2, command-r, cohere2 and falcon against llama.cpp:
each family's tiny random transformers checkpoint written as an F32 and a Q8_0 GGUF the way
llama.cpp's converter lays it out (layernorm_gguf.py), vllmx's greedy tokens teacher-forced through
llama.cpp on the same file (TESTING.md's rule for quantized files: every position within 1.5 nats of
llama.cpp's best, >= 95% its argmax), and prompt logits near llama.cpp's. The F32 file also
matches vllmx on the safetensors checkpoint it came from (whose transformers parity is
test_layernorm_families_parity.py's)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.layernorm_gguf import GGUF_ARCH, write_layernorm_gguf
from tests.models.llamacpp_parity import MIN_STRICT, llamacpp_positions
from tests.models.parity import prompt_logits_rel_error, vllmx_prompt_logits
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

SEED = int(os.environ.get("VLLMX_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
# Prompt logits against llama.cpp's, relative to their largest: F32 files differ by the f16 KV
# cache, summation order and llama.cpp's tanh GELU (GPT-NeoX's and Falcon's are erf); Q8_0 files
# also by llama.cpp's 8-bit activations.
PROMPT_RTOL = {"F32": 5e-3, "Q8_0": 8e-2}
PROMPT_LENS = (5, 40, 17, 33, 9, 70, 24, 12, 28, 7, 51, 15, 36, 11, 63, 20)


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gguf-layernorm"))


def tiny_gguf(family: str, qname: str, out_dir: str) -> tuple[str, str]:
    """(safetensors directory, GGUF path) of the family's tiny checkpoint."""
    src = os.path.join(out_dir, f"{family}-float32")
    if not os.path.exists(src):
        src = make_checkpoint(family, "float32", out_dir)
    path = os.path.join(out_dir, f"{family}-{qname}.gguf")
    if not os.path.exists(path):
        qtype = None if qname == "F32" else gguf.GGMLQuantizationType[qname]
        write_layernorm_gguf(src, family, path, qtype)
    return src, path


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(SEED)
    return [rng.integers(3, VOCAB, size=n).tolist() for n in PROMPT_LENS]


@pytest.mark.parametrize("qname", ["F32", "Q8_0"])
@pytest.mark.parametrize("family", sorted(GGUF_ARCH))
def test_greedy_parity_with_llamacpp(family, qname, ckpt_dir):
    from vllmx import LLM, SamplingParams

    _, path = tiny_gguf(family, qname, ckpt_dir)
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == GGUF_ARCH[family]
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256)
    ref = llama_cpp.Llama(path, n_ctx=256, n_threads=os.cpu_count(), logits_all=True,
                          verbose=False)
    ps = prompts()
    outs = llm.generate([{"prompt_token_ids": p} for p in ps],
                        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    strict = total = 0
    for prompt, out in zip(ps, outs):
        toks = list(out.outputs[0].token_ids)
        report, logits = llamacpp_positions(ref, prompt, toks)
        assert report.failed == 0, f"{family} {qname} (seed {SEED}, len {len(prompt)}): {report}"
        strict, total = strict + report.strict, total + len(toks)
        rel = prompt_logits_rel_error(llm, prompt, logits)
        assert rel < PROMPT_RTOL[qname], f"{family} {qname} prompt logits rel. error {rel:.3g} " \
                                         f"(seed {SEED})"
    assert strict >= MIN_STRICT * total, f"{family} {qname}: {strict}/{total} strict (seed {SEED})"


@pytest.mark.parametrize("family", sorted(GGUF_ARCH))
def test_f32_gguf_matches_safetensors(family, ckpt_dir):
    """The same weights from either file: the same prompt logits and greedy tokens (an f32 KV
    cache for both: a GGUF's default cache is f16, an f32 checkpoint's f32)."""
    from vllmx import LLM, SamplingParams

    src, path = tiny_gguf(family, "F32", ckpt_dir)
    ps = prompts()
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    runs = []
    for model in (src, path):
        llm = LLM(model, skip_tokenizer_init=True, max_model_len=256,
                  kv_cache_dtype="float32")
        toks = [o.outputs[0].token_ids for o in
                llm.generate([{"prompt_token_ids": p} for p in ps], params)]
        runs.append((toks, [vllmx_prompt_logits(llm, p) for p in ps]))
    (toks_st, logits_st), (toks_gguf, logits_gguf) = runs
    for a, b in zip(logits_st, logits_gguf):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * np.abs(a).max())
    assert toks_gguf == toks_st
