"""The families beyond Llama and Qwen3 on the GPU, dense and mixture-of-experts: token parity
against transformers on the same GPU (bf16: delta 0.5 nats; f32: delta 0.01) for the tiny
checkpoints of tests/models/tiny_checkpoints.py at head_dim 64 (the tensor-core attention path)
and Gemma 2 / 3's (head_dim 32: the generic path, with Gemma 2's attention soft cap), prompts
longer than their sliding windows."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.parity import check_positions, log_softmax
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# An f32 oracle computes in f32: cuDNN's convolutions (the hybrids' causal conv1d in
# transformers' reference path) would otherwise round their inputs to TF32.
torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

# Mixture of experts (cuda/fused_moe.cu): softmax top-k routing, shared experts; GLM-4.5's
# sigmoid routing over expert groups steered by its choice bias; gpt-oss's biased experts and
# clamped SwiGLU beside attention sinks (head_dim 16: the generic attention kernel; the
# tensor-core kernels' sinks: test_cuda_attention.py); DeepSeek V2 / V3's multi-head
# latent attention (batched_linear per head, one latent cache for keys and values: head size 40
# on the generic kernel; DeepSeek's own 512 + 64 with its 128-wide nope and value heads,
# deepseek_v2_lite_576, on attention_mla.cu, its prompts' prefill on decompressed keys and
# values in heads padded to 256: layers/mla.py).
MOE = ["qwen3_moe", "mixtral", "granite_moe", "granite_moe_shared", "qwen2_moe", "glm4_moe",
       "gpt_oss", "deepseek_v2", "deepseek_v3", "deepseek_v2_lite_576"]
# The hybrids (cuda/linear_attn.cu's mixers over per-request state slots on the device): checked
# as the MoE models are in bf16 (their recurrent states, and some their routers, round), at
# their tiny configs' own sizes.
HYBRID = ["qwen3_next", "granite_moe_hybrid", "nemotron_h", "falcon_h1"]
MOE += HYBRID
FAMILIES = ["granite", "smollm3", "phi3", "phi3_longrope", "glm4", "olmo2", "olmo3", "exaone4",
            "gemma2", "gemma3", "gpt_neox", "gpt_neox_seq", "stablelm", "stablelm_parallel",
            "starcoder2", "gpt2", "cohere", "cohere2", "falcon", "falcon_seq", *MOE]
SIZES = {"hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 1024}
# Mixture-of-experts models in bf16: a token whose k-th and (k+1)-th router scores lie within
# bf16's rounding picks its experts by that rounding, and no tolerance covers the jump. Measured
# on the tiny Mixtral: transformers' own bf16 greedy tokens, teacher-forced through its f32
# model, missed the argmax by 2.29 and 0.55 nats (2 of 256 positions). So these are checked
# against the f32 oracle (one side's rounding, not two), allowing such positions in at most 5%
# of the 256 (the quantized-file rule's share), each within MOE_BF16_GAP; f32 keeps the strict
# rule. 2% was too few: transformers' own bf16 greedy run of the tiny Mixtral, teacher-forced
# through its f32 model on this test's prompts (CPU, seeds 0-19), missed the 0.5-nat bound at
# 1, 1, 4, 4, 4, 6, 5, 1, 3, 4, 3, 4, 7, 3, 4, 5, 3, 4, 3, 6 positions (4 of 20 runs over 5), and
# vllmx's bf16 run on an H100 at 9 (2026-12-05, seed 4177727099). The gap: 3.0 nats was too
# tight: vllmx's bf16 tiny Qwen3-MoE on an H100 missed by 3.29 at 2 positions (2026-12-06, seed
# 3174443681), and transformers' own bf16 greedy run of it, teacher-forced through its f32
# model (CPU, seeds 0-11), by worst 0.98, 0.98, 2.44, 0.1, 4.72, 1.34, 0.69, 1.9, 2.14, 0.1,
# 2.98, 0.66 nats at 0-3 positions.
MOE_BF16_GAP, MOE_BF16_FAILED = 6.0, 12
# The hybrids round further in bf16: a recurrent state carries a token's rounding on to every
# later one. transformers' own bf16 greedy run of the tiny Qwen3-Next, teacher-forced through
# its f32 model on this test's prompts (CPU, seeds 0-7), missed the 0.5-nat bound at 30, 17,
# 35, 26, 18, 31, 17, 18 of the 256 positions, worst 1.6-5.0 nats; vllmx's bf16 runs on the
# H200 at 15 and 13 (worst 4.9) (2026-12-05). The gap: 6.0 was too tight: vllmx's bf16 run on an
# H100 (seed 1911338000, 2026-12-06) missed by 7.373 nats on its 146-token prompt, and
# transformers' own bf16 greedy run of it on the CPU by the same 7.373 (32 positions in all).
HYBRID_BF16_GAP, HYBRID_BF16_FAILED = 8.0, 40
SEED = int.from_bytes(os.urandom(4), "little")  # fresh prompts each run, printed on failure


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gpu-families"))


def checkpoint(family: str, out_dir: str) -> str:
    if family == "gemma2":
        from tests.models.test_gemma2_parity import make_checkpoint as make_gemma2

        return make_gemma2("mixed", "bfloat16", out_dir)
    if family == "gemma3":
        from tests.models.test_gemma3_parity import make_checkpoint as make_gemma3

        return make_gemma3("mixed", "bfloat16", out_dir)
    if family == "deepseek_v2_lite_576":  # MLA's cache rows at DeepSeek's size
        return make_checkpoint("deepseek_v2_lite", "bfloat16", out_dir,
                               {"kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                "qk_nope_head_dim": 128, "v_head_dim": 128}, **SIZES)
    return make_checkpoint(family, "bfloat16", out_dir, **({} if family in HYBRID else SIZES))


def oracle_norm_ignores_groups() -> bool:
    """Whether this transformers' GraniteMoeHybridRMSNormGated takes no group size: 5.17's
    normalizes the Mamba2 output over all n_groups groups at once (the tiny checkpoint has 2),
    5.25's group by group as mamba_ssm's kernel, vLLM and vllmx do. Against 5.17 on the H100
    machine vllmx's CPU engine missed 10-19 of 32 positions by up to 0.59 nats, as its GPU run
    did, where against 5.25 it matches exactly (2026-12-06)."""
    import inspect

    from transformers.models.granitemoehybrid import modeling_granitemoehybrid as m

    init = m.GraniteMoeHybridRMSNormGated.__init__
    return "group_size" not in inspect.signature(init).parameters


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype,delta", [("bfloat16", 0.5), ("float32", 0.01)])
def test_token_parity_vs_transformers_on_gpu(ckpt_dir, family, dtype, delta):
    from vllmx import LLM, SamplingParams

    if family == "granite_moe_hybrid" and oracle_norm_ignores_groups():
        pytest.skip(f"transformers {transformers.__version__} normalizes GraniteMoeHybrid's "
                    "gated RMSNorm over all its groups at once (vllmx, vLLM and later "
                    "transformers: group by group)")
    path = checkpoint(family, ckpt_dir)
    rng = np.random.default_rng(SEED)
    lens = rng.integers(3, 200, size=8)
    lens[0] = 300  # several KV blocks, past every window
    prompts = [rng.integers(3, VOCAB, size=int(n)).tolist() for n in lens]
    llm = LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=512, dtype=dtype,
              kv_cache_memory_bytes=256 << 20)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    moe_bf16 = family in MOE and dtype == "bfloat16"
    # The hybrids' f32 oracle runs on the CPU (as the CPU tests' does).
    dev = "cpu" if family in HYBRID and dtype == "float32" else "cuda"
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32 if moe_bf16 else getattr(torch, dtype),
        # (sdpa has no soft cap and no sinks)
        attn_implementation="eager" if family in ("gemma2", "gpt_oss") else "sdpa").to(dev).eval()
    failed = 0
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        assert len(toks) == 32
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device=dev)).logits[0]
        lp = log_softmax(logits.double().cpu().numpy())
        report = check_positions(lp[len(prompt) - 1:-1], toks, delta)
        where = f"{family} {dtype} (seed {SEED}, len {len(prompt)}): {report}"
        failed += report.failed
        if moe_bf16:
            most, gap = ((HYBRID_BF16_FAILED, HYBRID_BF16_GAP) if family in HYBRID
                         else (MOE_BF16_FAILED, MOE_BF16_GAP))
            assert failed <= most and report.worst_gap < gap, where
        else:
            assert report.failed == 0, where


def test_block_experts_are_dequantized_on_gpu(tmp_path):
    """A Qwen3-MoE GGUF of Q8_0 blocks, experts included, on the GPU in f32: the experts go up
    dequantized (CUDA's fused_experts runs dense experts), the rest runs as stored; token
    parity (f32 delta) with transformers on the checkpoint with every matrix and expert stack
    replaced by its Q8_0 round trip (rows along the last dim, as the GGUF stores them), but
    the routers, which the file keeps in F32 as llama-quantize does."""
    from gguf import GGMLQuantizationType, quants

    from tests.models.tiny_checkpoints import tiny_gguf
    from vllmx import LLM, SamplingParams

    path = tiny_gguf("qwen3_moe_gguf", "Q8_0", str(tmp_path), writer="gguf")
    hf_dir = os.path.join(str(tmp_path), "h64", "qwen3_moe_gguf-float32")
    rng = np.random.default_rng(SEED)
    prompts = [rng.integers(3, VOCAB, size=int(n)).tolist() for n in rng.integers(3, 120, 6)]
    llm = LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=512,
              dtype="float32", kv_cache_memory_bytes=256 << 20)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    q8 = GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, p in oracle.named_parameters():
            if p.dim() >= 2 and not name.endswith("mlp.gate.weight"):  # (routers stay F32)
                rows = p.numpy().reshape(-1, p.shape[-1])
                p.copy_(torch.from_numpy(quants.dequantize(quants.quantize(rows, q8), q8)
                                         .reshape(p.shape)))
    oracle = oracle.cuda()
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device="cuda")).logits[0]
        report = check_positions(log_softmax(logits.double().cpu().numpy())[len(prompt) - 1:-1],
                                 toks, 0.01)
        assert report.failed == 0, f"seed {SEED}, prompt len {len(prompt)}: {report}"
