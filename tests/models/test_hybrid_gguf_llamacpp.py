"""Hybrid GGUFs (Mamba2 / Gated DeltaNet layers beside attention) against llama.cpp: the tiny
random hybrid checkpoints (tiny_checkpoints.py) written as F32 and Q8_0 GGUFs the way llama.cpp's
converter lays them out (hybrid_gguf.py), vllmx's greedy tokens teacher-forced through llama.cpp
on the same file (TESTING.md's rule for quantized files, both engines with f32 KV caches and
llama.cpp's f32 recurrent state), prompt logits near llama.cpp's; the F32 file gives vllmx the
prompt logits of the safetensors checkpoint it was written from (the same weights, A only
through log(-A)); a tensor vllmx would not run is refused by name."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.hybrid_gguf import FAMILIES, write_hybrid_gguf
from tests.models.llamacpp_parity import MIN_STRICT, llamacpp_positions
from tests.models.parity import vllmx_prompt_logits
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

SEED = int(os.environ.get("VLLMX_TEST_SEED", "20261202"))
# Prompt logits against llama.cpp's, relative to their largest: F32 files by summation order;
# Q8_0 files also by activations on the other side of an 8-bit rounding step in one engine.
# Prompt logits' max relative gap. Q8_0: llama.cpp and vllmx quantize activations in different
# blocks (vllmx's repacked panels, per SIMD level), and Qwen3-Next's gated delta rule carries
# that rounding across the prompt (0.15-0.23 measured with the AVX2 / scalar panels); the
# binding check is TESTING.md's per-position rule above.
PROMPT_RTOL = {"F32": 1e-4, "Q8_0": 0.3}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hybrid-gguf"))


def tiny_gguf(family: str, qname: str, out_dir: str) -> str:
    path = os.path.join(out_dir, f"{family}-{qname}.gguf")
    if not os.path.exists(path):
        qtype = None if qname == "F32" else gguf.GGMLQuantizationType[qname]
        write_hybrid_gguf(make_checkpoint(family, "float32", out_dir), family, path, qtype)
    return path


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(SEED)
    return [rng.integers(3, VOCAB, size=n).tolist() for n in (5, 40, 17, 33, 9, 70, 24, 12)]


@pytest.mark.parametrize("qname", ["F32", "Q8_0"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_parity_with_llamacpp(family, qname, ckpt_dir):
    from vllmx import LLM, SamplingParams

    path = tiny_gguf(family, qname, ckpt_dir)
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == FAMILIES[family]
    if qname != "F32":
        assert any(t.tensor_type.name == qname for t in reader.tensors)
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, kv_cache_dtype="float32")
    ref = llama_cpp.Llama(path, n_ctx=256, n_threads=os.cpu_count(), logits_all=True,
                          verbose=False, type_k=0, type_v=0)  # 0: GGML_TYPE_F32
    prompts = _prompts()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    strict = total = 0
    worst = 0.0
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        report, logits = llamacpp_positions(ref, prompt, toks)
        assert report.failed == 0, f"{family} {qname} (seed {SEED}, len {len(prompt)}): {report}"
        strict, total = strict + report.strict, total + len(toks)
        want = logits[: len(prompt)]
        rel = float(np.abs(vllmx_prompt_logits(llm, prompt) - want).max() / np.abs(want).max())
        worst = max(worst, rel)
    assert strict >= MIN_STRICT * total, f"{family} {qname}: {strict}/{total} strict (seed {SEED})"
    assert worst < PROMPT_RTOL[qname], f"{family} {qname}: prompt logits {worst:.3g} apart"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_f32_gguf_gives_the_checkpoints_logits(family, ckpt_dir):
    from vllmx import LLM

    path = tiny_gguf(family, "F32", ckpt_dir)
    from_gguf = LLM(path, skip_tokenizer_init=True, max_model_len=256, kv_cache_dtype="float32")
    from_hf = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True,
                  max_model_len=256, kv_cache_dtype="float32")
    for prompt in _prompts()[:3]:
        want = vllmx_prompt_logits(from_hf, prompt)
        rel = np.abs(vllmx_prompt_logits(from_gguf, prompt) - want).max() / np.abs(want).max()
        # The files differ only by f32 roundings (the converter's w + 1 norms, regrouped
        # projections): 2e-7 - 2e-6 for most families, up to 1.1e-5 for Qwen3-Next (measured
        # 2026-12-03), whose routing and gated layers amplify them; a layout mistake is >= 1e-3.
        assert rel < 3e-5, f"{family}: {rel:.3g}"


def test_a_tensor_vllmx_would_not_run_is_refused_by_name(ckpt_dir, tmp_path):
    """A Mamba-1 style x projection (ssm_x) in a granitehybrid file: no hybrid here runs it."""
    from vllmx import LLM

    src = gguf.GGUFReader(tiny_gguf("granite_hybrid_dense", "F32", ckpt_dir))
    path = str(tmp_path / "extra.gguf")
    w = gguf.GGUFWriter(path, "granitehybrid")
    for name, field in src.fields.items():
        if name.startswith(("granitehybrid.", "tokenizer.")):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in src.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.add_tensor("blk.0.ssm_x.weight", np.zeros((8, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'blk.0.ssm_x.weight' is not supported"):
        LLM(path, skip_tokenizer_init=True, max_model_len=256)
