"""GGUF archs granite, smollm3, phi3, glm4, olmo2 (OLMo 2, and OLMo 3 with its windows and YaRN)
and gemma2 against llama.cpp: a tiny random transformers checkpoint written as an F32 and a Q8_0
GGUF the way llama.cpp's converter lays it out (tests/models/tiny_checkpoints.py,
test_gemma2_parity.py), vllmx's greedy tokens teacher-forced through llama.cpp on the same file
(TESTING.md's rule for quantized files: every position within 1.5 nats of llama.cpp's best,
>= 95% its argmax), and prompt logits near llama.cpp's; the same checkpoints through `vllmx
quantize` too. The F32 files of the same checkpoints match transformers in
test_llama_family_parity.py / test_gemma2_parity.py (which also cover Phi-3's window: llama.cpp
ignores Phi-3's sliding_window, so these files carry none)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tests.models.llamacpp_parity import MIN_STRICT, llamacpp_positions
from tests.models.parity import prompt_logits_rel_error
from tests.models.tiny_checkpoints import GGUF_ARCH, VOCAB, make_checkpoint, write_gguf

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

SEED = int(os.environ.get("VLLMX_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
# model -> the tiny checkpoint it is made from (tiny_checkpoints.py; gemma2: test_gemma2_parity)
MODELS = {"granite": "granite", "smollm3": "smollm3_gguf", "phi3": "phi3", "glm4": "glm4",
          "olmo2": "olmo2", "olmo3": "olmo3", "exaone4": "exaone4_gguf", "gemma2": "gemma2"}
# Prompt logits against llama.cpp's, relative to their largest: F32 files differ by the f16 KV
# cache and summation order; Q8_0 files also by activations landing on the other side of an
# 8-bit rounding step (2-4% on these models, as on test_gguf_nl_tq_llamacpp.py's).
PROMPT_RTOL = {"F32": 5e-3, "Q8_0": 8e-2}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gguf-archs"))


def tiny_gguf(model: str, qname: str, writer: str, out_dir: str) -> str:
    """The model's tiny checkpoint as a GGUF written by the test's gguf-py writer or by
    `vllmx quantize`."""
    from tests.models.test_gemma2_parity import make_checkpoint as make_gemma2
    from tests.models.test_gemma2_parity import write_gemma2_gguf
    from vllmx.cli.quantize import quantize_model

    family = MODELS[model]
    src = (make_gemma2("pattern2", "float32", out_dir) if family == "gemma2"
           else make_checkpoint(family, "float32", out_dir))
    path = os.path.join(out_dir, f"{model}-{qname}-{writer}.gguf")
    if writer == "quantize":
        from tests.cli.test_quantize import write_tokenizer

        src = shutil.copytree(src, path + ".src")
        write_tokenizer(src)  # llama.cpp loads no file without a vocabulary
        quantize_model(src, path, qname)
        return path
    qtype = None if qname == "F32" else gguf.GGMLQuantizationType[qname]
    if family == "gemma2":
        return write_gemma2_gguf(src, path, qtype)
    return write_gguf(src, family, path, qtype, window=False)


@pytest.mark.parametrize("writer", ["gguf", "quantize"])
@pytest.mark.parametrize("qname", ["F32", "Q8_0"])
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_greedy_parity_with_llamacpp(arch, qname, writer, ckpt_dir):
    from vllmx import LLM, SamplingParams

    if arch == "exaone4" and qname == "Q8_0":
        # llama.cpp slides exaone4's layers only at 64 layers; through 64 random layers the two
        # engines' 8-bit activation roundings compound (prompt logits 5-10% apart, 94% strict at
        # some seeds) past the rule meant for real models. The F32 files carry the check.
        pytest.skip("64 random layers in Q8_0 compound rounding past the quantized-file rule")
    if arch == "phi3" and writer == "quantize":
        # llama.cpp refuses a phi3 file with this test's byte-level BPE vocabulary ("error
        # loading model vocabulary: unordered_map::at"; Phi-3 ships SentencePiece, which vllmx
        # quantize does not write). Its F32 output matches the checkpoint in test_quantize.py.
        pytest.skip("llama.cpp loads no phi3 file with a byte-level BPE vocabulary")

    path = tiny_gguf(arch, qname, writer, ckpt_dir)
    expected = GGUF_ARCH.get(MODELS[arch], arch)
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == expected
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256)
    ref = llama_cpp.Llama(path, n_ctx=256, n_threads=os.cpu_count(), logits_all=True,
                          verbose=False)
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(3, VOCAB, size=n).tolist()
               for n in (5, 40, 17, 33, 9, 70, 24, 12, 28, 7, 51, 15, 36, 11, 63, 20)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    strict = total = 0
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        report, logits = llamacpp_positions(ref, prompt, toks)
        assert report.failed == 0, f"{arch} {qname} (seed {SEED}, len {len(prompt)}): {report}"
        strict, total = strict + report.strict, total + len(toks)
        rel = prompt_logits_rel_error(llm, prompt, logits)
        assert rel < PROMPT_RTOL[qname], f"{arch} {qname} prompt logits rel. error {rel:.3g} " \
                                         f"(seed {SEED})"
    assert strict >= MIN_STRICT * total, f"{arch} {qname}: {strict}/{total} strict (seed {SEED})"
