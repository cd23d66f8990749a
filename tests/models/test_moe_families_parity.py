"""Token parity of DeepSeek V2 / V3 (MLA, grouped routing, shared experts), GLM-4.5
(Glm4MoeForCausalLM: sigmoid routing with a choice bias, shared experts) and gpt-oss (attention
sinks, alternating windows, biased experts with the clamped SwiGLU) against transformers
(float32 on the CPU), for tiny random checkpoints in f32 and bf16 (tests/models/
tiny_checkpoints.py: 16 experts, top-4, 4 groups (V2-Lite's ungrouped softmax too), a dense
first layer, random norm weights and choice biases; gpt-oss 8 experts, top-2). The MLA cache is checked to be one latent row a
token, and what sets each model apart (the groups, the choice bias, the shared expert, the
scaling factor, the query latent's norm, YaRN's softmax scale, the sinks, the window, the
experts' biases and activation) is checked to move the logits, so that the parity tests test
it."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from tests.models.parity import assert_prompt_logits_match, vllmx_prompt_logits
from tests.models.test_llama_family_parity import SEED, random_prompts, run_parity
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint, write_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = ["qwen2_moe", "deepseek_v3", "deepseek_v3_yarn", "deepseek_v2", "deepseek_v2_lite", "glm4_moe",
            "gpt_oss"]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-moe"))


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_f32(family, ckpt_dir):
    path = make_checkpoint(family, "float32", ckpt_dir)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, family, SEED)


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_bf16(family, ckpt_dir):
    path = make_checkpoint(family, "bfloat16", ckpt_dir)
    # oracle: the same bf16 weights (routers f32, as stored), in f32; an f32 KV cache, as for
    # every MoE (test_llama_family_parity.cache_dtype_for: a router near a tie)
    run_parity(path, path, "float32")


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
@pytest.mark.parametrize("engine", ["one_step", "chunked", "churn"])
def test_mla_prefill_on_decompressed_keys(family, engine, ckpt_dir, monkeypatch):
    """Whole prompts' prefill on decompressed keys and values (layers/mla.py: the GPU's path,
    forced on here) gives the latent-space path's prompt log-probs and tokens, within f32
    rounding. With the default token budget the prompts are one step of whole prompts, which
    takes it in every layer once; with 160 tokens a step the prompts' later chunks and the
    decodes attend in the latent space beside the whole prompts after them; with two
    sequences at a time and unequal outputs new prompts take the rows of finished ones, in
    the middle of the batch, and are swapped to its end (InputBatch.put_last). A step of
    prompts shorter than the runner's minimum does not take it, nor does such a prompt among
    longer ones."""
    from vllmx import LLM, SamplingParams
    from vllmx.layers.mla import MLAAttention
    from vllmx.worker.step_inputs_runner_mixin import MLA_MIN_PREFILL_QUERY

    path = make_checkpoint(family, "float32", ckpt_dir)
    rng = np.random.default_rng(SEED)
    # (the third shorter than the minimum: latent, in the same steps, put before the others)
    lens = [*rng.integers(MLA_MIN_PREFILL_QUERY, 160, 2), MLA_MIN_PREFILL_QUERY - 1,
            *rng.integers(MLA_MIN_PREFILL_QUERY, 160, 3)]
    long_prompts = [rng.integers(3, VOCAB, int(n)).tolist() for n in lens]
    short_prompts = [rng.integers(3, VOCAB, MLA_MIN_PREFILL_QUERY // 2).tolist()]
    sp = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, prompt_logprobs=0)
          for n in (6, 2, 9, 4, 3, 5)]
    engine_args = {"one_step": {}, "chunked": {"max_num_batched_tokens": 160},
                   "churn": {"max_num_seqs": 2}}[engine]
    prefill = MLAAttention._prefill
    runs = {}
    for on in (False, True):
        calls = []
        monkeypatch.setattr(MLAAttention, "decompress_prefill", on)
        monkeypatch.setattr(MLAAttention, "_prefill",
                            lambda self, *a, calls=calls: calls.append(1) or prefill(self, *a))
        llm = LLM(path, skip_tokenizer_init=True, kv_cache_dtype="float32", **engine_args)
        layers = llm.llm_engine.model.config["num_hidden_layers"]
        outs = llm.generate([{"prompt_token_ids": p} for p in long_prompts], sp)
        if engine == "one_step":
            assert len(calls) == (layers if on else 0)
        else:  # (steps of whole prompts, or their first chunks, after other rows)
            assert len(calls) >= layers if on else not calls
        seen = len(calls)
        llm.generate([{"prompt_token_ids": p} for p in short_prompts], sp[0])
        assert len(calls) == seen
        runs[on] = outs
    for prompt, latent, dec in zip(long_prompts, runs[False], runs[True]):
        assert dec.outputs[0].token_ids == latent.outputs[0].token_ids
        for tok, a, b in zip(prompt[1:], latent.prompt_logprobs[1:], dec.prompt_logprobs[1:]):
            assert abs(a[tok].logprob - b[tok].logprob) < 1e-4, (family, SEED)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
def test_mla_cache_is_one_latent_row_a_token(family, ckpt_dir):
    from vllmx import LLM

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True)
    cfg = llm.llm_engine.model.config
    for key_cache, value_cache in llm.llm_engine.kv_caches:
        assert key_cache is value_cache
        assert key_cache.shape[2:] == (1, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])


def _perturb(model, feature: str) -> None:
    """Turns one feature off in a loaded model (host arrays: CPU only)."""
    for layer in model.layers:
        block = getattr(layer, "mlp", None) or getattr(layer, "experts", None)
        if feature == "q_latent_norm":
            layer.self_attn.q_a_layernorm.weight = np.ones_like(
                layer.self_attn.q_a_layernorm.weight)
        if feature == "softmax_mscale":  # YaRN's mscale_all_dim^2 off the softmax scale
            attn = layer.self_attn
            attn.attn.scale = (attn.dn + attn.dr) ** -0.5
        if feature == "sinks":
            layer.attn.sinks = None
        elif feature == "window":
            layer.attn.sliding_window = 0
        elif feature == "expert_biases":
            block.w13_bias = block.w2_bias = None
        elif feature == "swigluoai":
            block.activation = "silu"
        if not hasattr(block, "routing"):
            continue  # a dense layer
        r = block.routing
        if feature == "groups":
            block.routing = dataclasses.replace(r, topk_group=r.num_expert_group)
        elif feature == "choice_bias":
            block.routing = dataclasses.replace(r, e_score_correction_bias=None)
        elif feature == "scaling":
            block.routing = dataclasses.replace(r, routed_scaling_factor=1.0)
        elif feature == "shared_experts":
            block.shared_experts = None


@pytest.mark.parametrize("family,feature", [
    ("deepseek_v3", "groups"), ("deepseek_v3", "choice_bias"), ("deepseek_v3", "scaling"),
    ("deepseek_v3", "shared_experts"), ("deepseek_v3", "q_latent_norm"),
    ("deepseek_v3_yarn", "softmax_mscale"),
    ("deepseek_v2", "groups"), ("deepseek_v2", "scaling"), ("glm4_moe", "choice_bias"),
    ("glm4_moe", "shared_experts"), ("gpt_oss", "sinks"), ("gpt_oss", "window"),
    ("gpt_oss", "expert_biases"), ("gpt_oss", "swigluoai")])
def test_each_feature_matters(family, feature, ckpt_dir):
    from vllmx import LLM

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True)
    prompt = random_prompts(np.random.default_rng(SEED))[0]
    base = vllmx_prompt_logits(llm, prompt)
    _perturb(llm.llm_engine.model, feature)
    moved = vllmx_prompt_logits(llm, prompt)
    assert np.abs(moved - base).max() / np.abs(base).max() > 1e-2, feature


@pytest.mark.parametrize("family", ["glm4_moe", "gpt_oss_gguf"])
def test_f32_gguf_is_the_safetensors_run(family, ckpt_dir):
    """GLM-4.5's and gpt-oss's F32 GGUFs, laid out as llama.cpp's converter lays them out
    (gpt-oss's experts de-interleaved, apart and transposed; GLM-4.5's with the nextn layer it
    appends, random here), give the checkpoint's logits: the same weights in another layout,
    and the nextn layer left out. (gpt_oss_gguf: the YaRN ramp a GGUF can say, rounded.)"""
    from vllmx import LLM

    path = make_checkpoint(family, "float32", ckpt_dir)
    gguf_path = write_gguf(path, family, os.path.join(ckpt_dir, f"{family}.gguf"))
    prompt = random_prompts(np.random.default_rng(SEED))[0]  # longer than gpt-oss's window
    # both in f32 (a GGUF's default cache is f16, which moves a router near a tie)
    want = vllmx_prompt_logits(LLM(path, skip_tokenizer_init=True, kv_cache_dtype="float32"),
                               prompt)
    got = vllmx_prompt_logits(LLM(gguf_path, skip_tokenizer_init=True,
                                  kv_cache_dtype="float32"), prompt)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def test_fused_gguf_experts_are_refused_by_name(ckpt_dir):
    """convert_hf_to_gguf.py --fuse-gate-up-exps writes ffn_gate_up_exps, which the llama.cpp
    vllmx is checked against does not read for glm4moe or gpt-oss: refused, naming it."""
    from vllmx.loader.gguf import gguf_to_hf_config, load_gguf
    from vllmx.models.llama import LlamaForCausalLM

    path = make_checkpoint("glm4_moe", "float32", ckpt_dir)
    meta, weights = load_gguf(write_gguf(path, "glm4_moe", os.path.join(ckpt_dir, "fused.gguf")))
    weights = {k.replace("ffn_gate_exps", "ffn_gate_up_exps"): v for k, v in weights.items()
               if "ffn_up_exps" not in k}
    with pytest.raises(ValueError, match=r"ffn_gate_up_exps\.weight.*--fuse-gate-up-exps"):
        LlamaForCausalLM(gguf_to_hf_config(meta), weights)


def test_dummy_weights_have_the_checkpoint_shapes(ckpt_dir):
    """load_format="dummy" makes exactly the tensors a real checkpoint of the config has."""
    import json
    import os

    from safetensors import safe_open

    from vllmx.models.registry import get_model_class

    for family in FAMILIES:
        path = make_checkpoint(family, "float32", ckpt_dir)
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
            real = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        assert get_model_class(cfg).checkpoint_shapes(cfg) == real, family
