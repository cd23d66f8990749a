"""Tiny random Llama GGUFs in IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 (written by llama.cpp's own quantizer,
llama_model_quantize, from an F32 file) and MXFP4 (gguf's quantizer; llama.cpp only writes it for
MoE experts): vllmx loads each and agrees with llama.cpp on the same file: every greedy position
within 1.5 nats of llama.cpp's best (TESTING.md's rule for quantized GGUFs), most its argmax."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from tests.models.llamacpp_parity import llamacpp_positions
from tests.models.parity import prompt_logits_rel_error

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

# Rows of 256 so that the 256-block types cover every matrix (llama.cpp falls back otherwise).
VOCAB, HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 512, 256, 512, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS
# TESTING.md's 95% strict bar is for real models; random tiny ones have more close calls, and
# vllmx's Q4_0 / Q8_0 files of this model (types tested against real models) measure 58-63 of
# 64 positions strict against llama.cpp, so the bar here is 85% (the delta is TESTING.md's).
MIN_STRICT = 0.85
# Greedy positions checked per file: 16 prompts x 16 tokens. With 4 prompts (64 positions) the
# fraction was the draw's as much as the model's: IQ4_XS (activations as Q8_K, one int8 scale
# per 256 values, so a value f32 rounding moves across a step moves further than under Q8_0)
# measured 57-63 of 64 over 24 seeds and 54 at seed 310707837, which failed CI; over 256
# positions the same seeds give 90.2-96.9% (that seed 90.2%), IQ4_NL 93.8-98.4%.
PROMPT_LENS = (5, 17, 33, 9, 12, 28, 7, 21, 40, 15, 3, 26, 11, 35, 19, 8)
# Weights and prompts; printed on failure (VLLMX_TEST_SEED replays one).
SEED = int(os.environ.get("VLLMX_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
Q = gguf.GGMLQuantizationType
FTYPES = {"IQ4_NL": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
          "IQ4_XS": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
          "TQ1_0": llama_cpp.LLAMA_FTYPE_MOSTLY_TQ1_0, "TQ2_0": llama_cpp.LLAMA_FTYPE_MOSTLY_TQ2_0}


def tensors(rng):
    """GGUF name -> f32 array (PyTorch order), a Llama with random weights."""
    def mat(rows, cols):  # a little wider than 1/sqrt(fan-in), so logits are not all ties
        return (rng.standard_normal((rows, cols)) * (2.0 / np.sqrt(cols))).astype(np.float32)

    out = {"token_embd.weight": mat(VOCAB, HIDDEN), "output.weight": mat(VOCAB, HIDDEN),
           "output_norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": np.ones(HIDDEN, np.float32),
                p + "ffn_norm.weight": np.ones(HIDDEN, np.float32),
                p + "attn_q.weight": mat(HIDDEN, HIDDEN),
                p + "attn_k.weight": mat(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "attn_v.weight": mat(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "attn_output.weight": mat(HIDDEN, HIDDEN),
                p + "ffn_gate.weight": mat(FFN, HIDDEN), p + "ffn_up.weight": mat(FFN, HIDDEN),
                p + "ffn_down.weight": mat(HIDDEN, FFN)}
    return out


def write_gguf(path: str, weights: dict, qtype=None) -> str:
    """Matrices as `qtype` blocks (gguf's quantizer) or F32; token ids only (no vocab)."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("no_vocab")
    for name, t in weights.items():
        if qtype is not None and t.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llamacpp_quantize(src: str, dst: str, ftype: int) -> str:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize -> {rc}"
    return dst


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    rng = np.random.default_rng(SEED)
    return write_gguf(str(tmp_path_factory.mktemp("nl_tq") / "f32.gguf"), tensors(rng))


@pytest.fixture(params=["IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4"])
def model_file(request, f32_gguf):
    name = request.param
    dst = os.path.join(os.path.dirname(f32_gguf), f"{name}.gguf")
    if name == "MXFP4":
        write_gguf(dst, tensors(np.random.default_rng(SEED)), Q.MXFP4)
    else:
        llamacpp_quantize(f32_gguf, dst, FTYPES[name])
    types = {t.tensor_type.name for t in gguf.GGUFReader(dst).tensors}
    assert name in types, types  # the file really exercises the type
    return name, dst


def test_greedy_parity_with_llamacpp(model_file):
    from vllmx import LLM, SamplingParams

    name, path = model_file
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256)
    ref = llama_cpp.Llama(path, n_ctx=256, n_threads=os.cpu_count(), logits_all=True,
                          verbose=False)
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(3, VOCAB, size=n).tolist() for n in PROMPT_LENS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    strict = total = 0
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        report, logits = llamacpp_positions(ref, prompt, toks)
        assert report.failed == 0, f"{name} (seed {SEED}): {report}"
        strict, total = strict + report.strict, total + len(toks)
        # Prompt logits near llama.cpp's. Not closer: an activation that lands on the other
        # side of an 8-bit rounding step (f32 sums in another order, f16 KV) moves by a whole
        # step; the Q4_0, Q8_0 and Q4_K_S files of this model differ by 2-4% the same way, and
        # the F32 file by 0.1%.
        # MXFP4 files differ more, both engines alike: over 16 seeds the worst prompt was
        # 0.03-0.097 from llama.cpp, and at seed
        # 470166742 (0.097) each engine was as far from the exact f32 logits of the dequantized
        # weights (llama.cpp on an F32 file of them): vllmx 0.022-0.082, llama.cpp 0.024-0.055.
        # IQ4_XS's Q8_K activations move further on such a step: over 31 seeds x 16 prompts its
        # worst prompt was 0.0895 from llama.cpp (median 0.038, 99th percentile 0.068), where
        # IQ4_NL's was 0.043 and TQ1_0 / TQ2_0's 0.072.
        rel = prompt_logits_rel_error(llm, prompt, logits)
        bound = {"MXFP4": 0.12, "IQ4_XS": 0.11}.get(name, 8e-2)
        assert rel < bound, f"{name} prompt logits rel. error {rel:.3g} (seed {SEED})"
    assert strict >= MIN_STRICT * total, f"{name}: {strict}/{total} strict (seed {SEED})"
