"""LoRA on GGUF: a PEFT adapter on a GGUF base (whose Llama q/k rows llama.cpp's converter
permuted: the adapter's q/k B rows are permuted the same way) against transformers + peft
(TESTING.md's token parity, f32, delta 0.01); llama.cpp's own GGUF adapter format (written
here as its convert_lora_to_gguf.py lays it out) on that base, F32 and Q8_0, against llama.cpp
loading the same adapter (the quantized-file rule; prompt logits), and on the safetensors
checkpoint against peft; adapters that do not fit refused by name."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.lora.adapters import check_against_peft, make_adapter
from tests.models.llamacpp_parity import MIN_STRICT, llamacpp_positions
from tests.models.parity import prompt_logits_rel_error
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint, write_gguf

pytest.importorskip("torch")
pytest.importorskip("peft")
gguf = pytest.importorskip("gguf")

SEED = int.from_bytes(os.urandom(4), "little")
DELTA = 0.01
GGUF_MODULES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
                "o_proj": "attn_output", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
                "down_proj": "ffn_down"}


def write_gguf_adapter(peft_dir: str, hf_dir: str, out_path: str, arch: str = "llama") -> str:
    """A PEFT adapter as llama.cpp's convert_lora_to_gguf.py writes it: general.type adapter,
    adapter.type lora, adapter.lora.alpha; blk.N.<tensor>.weight.lora_a [r, in] and .lora_b
    [out, r] (F32), q/k B rows permuted as the base's q/k rows are."""
    from safetensors.numpy import load_file

    from vllmx.loader.hf_to_gguf import permute_qk

    with open(os.path.join(peft_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
    w = gguf.GGUFWriter(out_path, arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(acfg["lora_alpha"]))
    for name, t in sorted(load_file(os.path.join(peft_dir, "adapter_model.safetensors")).items()):
        parts = name.split(".")  # base_model.model.model.layers.I.self_attn.q_proj.lora_A.weight
        layer, module, ab = parts[4], parts[6], parts[7]
        t = t.astype(np.float32)
        if ab == "lora_B" and module in heads:
            t = permute_qk(t, heads[module])
        w.add_tensor(f"blk.{layer}.{GGUF_MODULES[module]}.weight.{ab.lower()}",
                     np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("lora-gguf"))
    base = make_checkpoint("llama", "float32", out)
    adapter = make_adapter(base, out, "all", seed=0)
    return {"hf": base, "gguf": write_gguf(base, "llama", os.path.join(out, "base.gguf")),
            "peft": adapter,
            "gguf_adapter": write_gguf_adapter(adapter, base, os.path.join(out, "lora.gguf")),
            "out": out}


def prompts(n=8):
    rng = np.random.default_rng(SEED)
    return [rng.integers(3, VOCAB, size=k).tolist() for k in rng.integers(3, 40, size=n)]


def greedy(max_tokens=32):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def engine(path: str):
    from vllmx import LLM

    return LLM(path, skip_tokenizer_init=True, kv_cache_dtype="float32", enable_lora=True,
               max_loras=1, max_lora_rank=16, max_model_len=256)


@pytest.mark.parametrize("base,adapter", [("gguf", "peft"), ("hf", "gguf_adapter")],
                         ids=["peft-on-gguf", "gguf-adapter-on-checkpoint"])
def test_parity_with_peft(setup, base, adapter):
    from vllmx.lora.request import LoRARequest

    llm, ps = engine(setup[base]), prompts()
    base_toks = [o.outputs[0].token_ids for o in
                 llm.generate([{"prompt_token_ids": p} for p in ps], greedy())]
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(),
                        lora_request=LoRARequest("a", 1, setup[adapter]))
    check_against_peft(outs, base_toks, ps, setup["hf"], setup["peft"], DELTA,
                       f"{adapter} on {base} (seed {SEED})")


# Prompt logits against llama.cpp's, relative to their largest: the F32 file's agree but for
# summation order; the Q8_0 file's also differ by activations landing on the other side of an
# 8-bit rounding step (as in tests/models/test_gguf_archs_llamacpp.py).
PROMPT_RTOL = {"F32": 1e-4, "Q8_0": 8e-2}


@pytest.mark.parametrize("qname", ["F32", "Q8_0"])
def test_gguf_adapter_against_llamacpp(setup, qname):
    """llama.cpp's adapter format on the GGUF base (F32, and Q8_0: the adapter's product added
    to a quantized projection's), against llama.cpp applying the same file."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from vllmx.lora.request import LoRARequest

    path = setup["gguf"]
    if qname != "F32":
        path = write_gguf(setup["hf"], "llama", os.path.join(setup["out"], f"base-{qname}.gguf"),
                          gguf.GGMLQuantizationType[qname])
    llm = engine(path)
    lora = LoRARequest("a", 1, setup["gguf_adapter"])
    # Both KV caches in f32 (type_k / type_v 0: GGML_TYPE_F32): with f16 ones the adapter's
    # larger keys round apart, 0.3-1% of the prompt logits over 40 positions.
    kw = {"n_ctx": 256, "n_threads": os.cpu_count(), "logits_all": True, "verbose": False,
          "type_k": 0, "type_v": 0}
    ref = llama_cpp.Llama(path, lora_path=setup["gguf_adapter"], **kw)
    plain = llama_cpp.Llama(path, **kw)
    strict = total = 0
    for p in prompts(12):
        toks = list(llm.generate({"prompt_token_ids": p}, greedy(),
                                 lora_request=lora)[0].outputs[0].token_ids)
        report, logits = llamacpp_positions(ref, p, toks)
        assert report.failed == 0, f"(seed {SEED}, len {len(p)}): {report}"
        strict, total = strict + report.strict, total + len(toks)
        llm.llm_engine.lora_manager.set_active_loras(np.full(len(p), 1), {1: lora})
        rel = prompt_logits_rel_error(llm, p, logits)
        assert rel < PROMPT_RTOL[qname], f"{qname} prompt logits rel. error {rel:.3g} " \
                                         f"(seed {SEED})"
        _, plain_logits = llamacpp_positions(plain, p, toks)
        assert np.abs(plain_logits - logits).max() > 0.1  # llama.cpp did apply the adapter
    assert strict >= MIN_STRICT * total, f"{strict}/{total} strict (seed {SEED})"


def test_adapters_that_do_not_fit_are_refused(setup):
    from vllmx.lora.request import LoRARequest

    llm = engine(setup["gguf"])
    with pytest.raises(ValueError, match=r"general.type None and adapter.type None, not a LoRA"):
        llm.llm_engine.add_lora(LoRARequest("base", 1, setup["gguf"]))
    qwen = write_gguf_adapter(setup["peft"], setup["hf"],
                              os.path.join(setup["out"], "qwen2-lora.gguf"), arch="qwen2")
    with pytest.raises(ValueError, match=r"GGUF adapter for architecture 'qwen2'; the base "
                                         r"model's is 'llama'"):
        llm.llm_engine.add_lora(LoRARequest("q", 2, qwen))
    with pytest.raises(ValueError, match=r"lora.gguf not found"):
        llm.llm_engine.add_lora(LoRARequest("x", 3, os.path.join(setup["out"], "x", "lora.gguf")))
