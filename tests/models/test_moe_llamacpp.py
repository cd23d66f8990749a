"""MoE GGUFs against llama.cpp: tiny random Qwen3-MoE (arch qwen3moe), Mixtral (arch llama
with ffn_gate_inp / ffn_{gate,up,down}_exps), GraniteMoe and GraniteMoeShared (arch granitemoe,
the shared MLP as ffn_{gate,up,down}_shexp), GLM-4.5 (arch glm4moe: sigmoid routing with
exp_probs_b, shared experts, a dense first layer, a nextn layer past the last one) and gpt-oss
(arch gpt-oss: attention sinks, even layers sliding, biased router and experts, swiglu_oai)
checkpoints written as F32 GGUFs the way llama.cpp's converter lays them out
(tests/models/tiny_checkpoints.py), then requantized by `vllmx quantize` (Q8_0; Q4_K at hidden
size 256, so that the experts' rows hold whole k-quant blocks); the router stays f32 as
llama-quantize leaves it. GLM-4.5 and gpt-oss are also written by the gguf package's quantizer:
Q8_0, and MXFP4 experts beside F32 rest (as gpt-oss ships). vllmx's greedy tokens
teacher-forced through llama.cpp on the same file pass TESTING.md's rule for quantized files,
and the prompt logits match llama.cpp's. Both
engines keep the KV cache in f32 here: with f16 caches (each rounding its own way) their logits
part by ~1.5% (dense models too), enough for a router near a tie to pick another expert, which
moves a position by tens of percent. With f32 caches F32 files agree to 1e-6; quantized ones
to 1e-7 on most prompts and within ~2% on the others (dense Llama files alike), but for the
rare router-tie position. The F32 files also match transformers (test_llama_family_parity.py).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.llamacpp_parity import MIN_STRICT, llamacpp_positions
from tests.models.parity import vllmx_prompt_logits
from tests.models.tiny_checkpoints import VOCAB, tiny_gguf

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

# One fixed draw of weights and prompts (VLLMX_TEST_SEED replays another): with 4- and 8-bit
# weights a router near a tie can pick another expert than llama.cpp does, and then that one
# position may fall past the rule's 1.5 nats (seed 3994248822: Mixtral Q4_K, 1.72 nats at 1 of
# 256 positions, the same before this code changed); fresh draws made the run fail now and then.
SEED = int(os.environ.get("VLLMX_TEST_SEED", 20261202))
PROMPT_RTOL = {"F32": 1e-4, "Q8_0": 3e-2, "Q4_K": 3e-2, "MXFP4": 3e-2}
MIN_CLOSE_POSITIONS = {"F32": 1.0, "Q8_0": 0.95, "Q4_K": 0.95, "MXFP4": 0.95}
FAMILIES = [("qwen3_moe_gguf", "qwen3moe"), ("mixtral", "llama"), ("granite_moe", "granitemoe"),
            ("granite_moe_shared", "granitemoe"), ("glm4_moe", "glm4moe"),
            ("gpt_oss_gguf", "gpt-oss")]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("moe-gguf"))


def check_against_llamacpp(path: str, family: str, arch: str, qname: str) -> None:
    from vllmx import LLM, SamplingParams

    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == arch
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    experts = min(n for n in types if n.endswith("ffn_gate_exps.weight"))  # a sparse layer's
    assert types[experts.replace("ffn_gate_exps", "ffn_gate_inp")] == "F32"
    if qname != "F32":  # the experts are quantized, their biases (gpt-oss) not
        assert types[experts] == qname
        assert types.get(experts.replace(".weight", ".bias"), "F32") == "F32"
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, kv_cache_dtype="float32")
    ref = llama_cpp.Llama(path, n_ctx=256, n_threads=os.cpu_count(), logits_all=True,
                          verbose=False, type_k=0, type_v=0)  # 0: GGML_TYPE_F32
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(3, VOCAB, size=n).tolist() for n in (5, 40, 17, 33, 9, 70, 24, 12)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    strict = total = close = positions = 0
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        report, logits = llamacpp_positions(ref, prompt, toks)
        assert report.failed == 0, f"{family} {qname} (seed {SEED}, len {len(prompt)}): {report}"
        strict, total = strict + report.strict, total + len(toks)
        want = logits[: len(prompt)]
        rel = np.abs(vllmx_prompt_logits(llm, prompt) - want).max(1) / np.abs(want).max()
        close, positions = close + int((rel < PROMPT_RTOL[qname]).sum()), positions + len(rel)
        worst = max(worst, float(rel.max()))
    assert strict >= MIN_STRICT * total, f"{family} {qname}: {strict}/{total} strict (seed {SEED})"
    assert close >= MIN_CLOSE_POSITIONS[qname] * positions, (
        f"{family} {qname}: prompt logits within {PROMPT_RTOL[qname]} at {close}/{positions} "
        f"positions, worst {worst:.3g} (seed {SEED})")


@pytest.mark.parametrize("qname", ["F32", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("family,arch", FAMILIES)
def test_greedy_parity_with_llamacpp(family, arch, qname, ckpt_dir):
    check_against_llamacpp(tiny_gguf(family, qname, ckpt_dir), family, arch, qname)


@pytest.mark.parametrize("qname", ["Q8_0", "MXFP4"])
@pytest.mark.parametrize("family,arch", [("glm4_moe", "glm4moe"), ("gpt_oss_gguf", "gpt-oss")])
def test_gguf_writer_files_with_llamacpp(family, arch, qname, ckpt_dir):
    check_against_llamacpp(tiny_gguf(family, qname, ckpt_dir, writer="gguf"), family, arch,
                           qname)
