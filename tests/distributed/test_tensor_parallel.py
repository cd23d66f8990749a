"""Tensor parallelism on the CPU (tensor_parallel_size > 1: rank 0 in the test's process, the
other ranks spawned, collectives over shared memory): greedy tokens of tiny random checkpoints
pass TESTING.md's parity against transformers as they do with one rank, batched == alone with
chunked prefill and preemption, and a rank that dies fails the engine with its story instead of
hanging it; what does not split raises a ValueError naming it."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests.models.test_llama_family_parity import run_parity
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint, write_gguf

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-tp"))


# llama at tp=4: 2 kv heads for 4 ranks (each kv head on two ranks); qwen3: tied embeddings,
# q/k norms; qwen3_moe: sparse and dense layers (3 layers: stages of 2 and 1); mixtral:
# experts w1/w2/w3; DeepSeek V2 / V3: MLA heads (V3 with its query latent), a dense first
# layer, shared experts, grouped routing; tp=2 x pp=2: two stages of two ranks; the Gated
# DeltaNet hybrids (Qwen3-Next's grouped projections, Qwen3.5's apart; their state slots on
# every rank); Phi-3's fused qkv_proj and gate_up_proj, GLM-4's fused gate_up_proj, cut
# section by section; OLMo's q / k norms over every head (gathered, normed whole, cut).
@pytest.mark.parametrize("family,tp,pp", [("llama", 2, 1), ("llama", 4, 1), ("qwen3", 2, 1),
                                          ("qwen3_moe", 2, 1), ("mixtral", 2, 1),
                                          ("deepseek_v2", 2, 1), ("deepseek_v3", 2, 1),
                                          ("llama", 1, 2), ("qwen3_moe", 1, 2),
                                          ("deepseek_v2", 1, 2), ("qwen3", 2, 2),
                                          ("qwen3_next", 2, 1), ("qwen3_5", 2, 1),
                                          ("qwen3_5_moe", 2, 1), ("qwen3_5", 1, 2),
                                          ("phi3", 2, 1), ("glm4", 2, 1),
                                          ("glm4_moe", 2, 1), ("starcoder2", 2, 1),
                                          ("cohere", 2, 1), ("cohere_bias", 2, 1),
                                          ("cohere2", 2, 1), ("olmo2", 2, 1),
                                          ("olmo2_bias", 2, 1), ("olmo3", 2, 1),
                                          ("exaone4", 2, 1), ("gpt_neox", 2, 1),
                                          ("gpt_neox_seq", 2, 1), ("granite_moe", 2, 1),
                                          ("granite_moe_shared", 2, 1), ("mistral", 2, 1),
                                          ("qwen2", 2, 1), ("qwen2_moe", 2, 1),
                                          ("smollm3", 2, 1), ("granite", 2, 1)])
def test_parity(family, tp, pp, ckpt_dir):
    path = make_checkpoint(family, "float32", ckpt_dir)
    llm, _, _ = run_parity(path, path, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    model = llm.llm_engine.model  # rank 0's share
    assert model.config["tp_size"] == tp and model.config["num_attention_heads"] == 4 // tp
    k_cache, _ = llm.llm_engine.kv_caches[0]
    # this rank's kv heads only (MLA: the one latent row a token, whole on every rank)
    hf = llm.llm_engine.config.model_config.hf_config
    kv = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    assert k_cache.shape[2] == (1 if model.config.get("use_mla") else max(1, kv // tp))
    layers = len(model.layers)
    assert sum(layer is not None for layer in model.layers) == -(-layers // pp)  # its stage's


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v2", "qwen3_moe_gguf"])
def test_expert_parallel_parity(family, ckpt_dir):
    """enable_expert_parallel at tp=2: each rank holds half the experts whole (a GGUF's stacked
    ones cut by experts), routing stays global; DeepSeek's shared experts stay cut by rows."""
    path = make_checkpoint(family, "float32", ckpt_dir)
    model_path = path
    if family.endswith("_gguf"):
        model_path = write_gguf(path, family, os.path.join(ckpt_dir, f"{family}.gguf"))
    # (an f32 KV cache, as the MoE parity tests run: a router near a tie)
    llm, _, _ = run_parity(model_path, path, "float32", tensor_parallel_size=2,
                           enable_expert_parallel=True)
    block = next(layer.experts if hasattr(layer, "experts") else layer.mlp
                 for layer in llm.llm_engine.model.layers
                 if getattr(getattr(layer, "experts", None) or getattr(layer, "mlp", None),
                            "expert_range", None) is not None)
    first, count = block.expert_range
    assert first == 0 and block.w13.shape[0] == count == block.gate.weight.shape[0] // 2


@pytest.mark.parametrize("which", ["gemma3", "gemma2", "gemma3_gguf"])
def test_gemma_parity(which, tmp_path):
    """Gemma 3 and Gemma 2 (their own forward: sandwich norms after the reduced o / down
    projections, the embedding scale, final soft-capping over the gathered logits) at tp=2;
    Gemma 3's GGUF, one kv head for two ranks."""
    from tests.models import test_gemma2_parity, test_gemma3_parity

    if which == "gemma2":
        path = test_gemma2_parity.make_checkpoint("mixed", "float32", str(tmp_path))
        model_path = path
    else:
        path = test_gemma3_parity.make_checkpoint(
            "mixed" if which == "gemma3" else "pattern6", "float32", str(tmp_path))
        model_path = path if which == "gemma3" else test_gemma3_parity.write_gemma3_gguf(
            path, str(tmp_path / "gemma3.gguf"))
    run_parity(model_path, path, "float32", tensor_parallel_size=2)
    if which == "gemma3":  # its own forward runs every layer: no pipeline stages for it
        from vllmx import LLM

        with pytest.raises(ValueError, match="pipeline_parallel_size > 1 is not supported for "
                                             "Gemma3ForCausalLM"):
            LLM(path, skip_tokenizer_init=True, pipeline_parallel_size=2)


@pytest.mark.parametrize("family", ["qwen3", "starcoder2_gguf", "granite_moe"])
def test_parity_gguf(family, ckpt_dir):
    """A GGUF (an F32 file) cut by its own tensor names: qwen3's; Starcoder2's LayerNorm
    layout (biases on every projection: the row-parallel ones' added by rank 0); GraniteMoe's
    stacked experts (gate / up / down apart)."""
    path = make_checkpoint(family, "float32", ckpt_dir)
    out = os.path.join(ckpt_dir, f"{family}.gguf")
    if family != "starcoder2_gguf":
        gguf_path = write_gguf(path, family, out)
    else:
        from tests.models.layernorm_gguf import write_layernorm_gguf

        gguf_path = write_layernorm_gguf(path, family, out)
    run_parity(gguf_path, path, "float32", tensor_parallel_size=2)  # (a GGUF's default: f16)


def test_block_weights_cut_at_block_boundaries(tmp_path):
    """Q8_0 rows cut at 32-value blocks: down_proj's 128 columns split in two whole halves
    give tp=1's tokens; 160 columns (80 a rank, not whole blocks) are refused by name."""
    import gguf

    from vllmx import LLM, SamplingParams

    q8 = gguf.GGMLQuantizationType.Q8_0
    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9]}, {"prompt_token_ids": list(range(3, 60))}]
    path = make_checkpoint("llama", "float32", str(tmp_path), intermediate_size=128)
    good = write_gguf(path, "llama", str(tmp_path / "llama-q8.gguf"), q8)
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    ref, out = (LLM(good, skip_tokenizer_init=True, tensor_parallel_size=tp).generate(prompts, sp)
                for tp in (1, 2))
    for r, o in zip(ref, out):
        # The same tokens up to a near tie of tp=1's (another summation order may break it)
        gaps = [abs(float(np.subtract(*sorted((lp.logprob for lp in pos.values()),
                                              reverse=True)[:2]))) for pos in r.outputs[0].logprobs]
        n = next((i for i, g in enumerate(gaps) if g < 1e-3), len(gaps))
        assert o.outputs[0].token_ids[:n] == r.outputs[0].token_ids[:n]
    path = make_checkpoint("llama", "float32", str(tmp_path / "odd"))
    bad = write_gguf(path, "llama", str(tmp_path / "llama-q8-odd.gguf"), q8)
    with pytest.raises(ValueError, match=r"ffn_down\.weight.*cannot be cut at columns 0\.\.80"):
        LLM(bad, skip_tokenizer_init=True, tensor_parallel_size=2)


def _greedy(max_tokens=16):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_batched_equals_alone(family, ckpt_dir):
    """Chunked prefill (64-token budget) and preemption (40 blocks) at tp=2; for a hybrid
    also its state slots taken, continued and given back across the ranks."""
    from vllmx import LLM

    path = make_checkpoint(family, "float32", ckpt_dir)
    llm = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2,
              num_gpu_blocks_override=40, block_size=16, max_num_batched_tokens=64,
              max_num_seqs=8)
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, size=n).tolist()}
               for n in rng.integers(20, 150, size=8)]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())]
    alone = [llm.generate([p], _greedy())[0].outputs[0].token_ids for p in prompts]
    assert batched == alone


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_decoding_keeps_the_tokens(method, ckpt_dir):
    """ngram and draft_model (the draft whole on rank 0) over a tp=2 target: the tokens of
    the same target without speculation, on repetitive prompts that get drafts accepted."""
    from vllmx import LLM

    path = make_checkpoint("llama", "float32", ckpt_dir)
    spec = {"method": method, "num_speculative_tokens": 3}
    spec.update({"prompt_lookup_max": 3} if method == "ngram" else {"model": path})
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": (rng.integers(3, VOCAB, size=6).tolist() * 5)[:n]}
               for n in (12, 25, 30)]
    plain = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, _greedy(24))]
    del plain
    llm = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy(24))] == expected
    assert llm.llm_engine.scheduler.spec_decode_num_draft_tokens > 0
    if method == "draft_model":  # the target itself as its draft: every draft is accepted
        assert llm.llm_engine.scheduler.spec_decode_num_accepted_tokens > 0


def test_hybrid_speculation_rolls_back_every_rank(ckpt_dir, monkeypatch):
    """A tp=2 hybrid under speculation with random drafts (nearly all rejected): each rank
    puts its heads' states after the last accepted position back (copy_states reaches the
    other rank), so the tokens are those without speculation."""
    from vllmx import LLM
    from vllmx.spec_decode.ngram_proposer import NgramProposer

    rng = np.random.default_rng()
    monkeypatch.setattr(NgramProposer, "propose_batch", lambda self, seqs: {
        r: rng.integers(3, VOCAB, 3).tolist() for r in seqs})  # (drafts are rank 0's)
    path = make_checkpoint("qwen3_5", "float32", ckpt_dir)
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, size=n).tolist()} for n in (5, 17)]
    plain = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, _greedy(20))]
    del plain
    llm = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy(20))] == expected
    assert llm.llm_engine.scheduler.spec_decode_num_draft_tokens > 0


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_lora_adapters_over_ranks(tp, pp, tmp_path):
    """LoRA at tp=2 (each rank its share of every adapter: B rows of column-parallel layers, A
    columns of row-parallel ones, summed with the base's products) and at pp=2 (each stage its
    layers' matrices): each adapter's greedy
    tokens pass parity against transformers + peft, and a batch mixing all three adapters and
    the base model gives every request its tokens alone, with more adapters than slots (their
    slots rewritten on every rank)."""
    pytest.importorskip("peft")
    from tests.lora.adapters import ADAPTERS, check_against_peft, make_adapter
    from vllmx import LLM
    from vllmx.lora.request import LoRARequest

    base = make_checkpoint("llama", "float32", str(tmp_path))
    paths = {name: make_adapter(base, str(tmp_path), name, seed=i)
             for i, name in enumerate(ADAPTERS)}
    reqs = [None] + [LoRARequest(name, i + 1, path) for i, (name, path) in
                     enumerate(paths.items())]
    llm = LLM(base, skip_tokenizer_init=True, kv_cache_dtype="float32", enable_lora=True,
              max_loras=2, max_lora_rank=16, tensor_parallel_size=tp,
              pipeline_parallel_size=pp)
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, size=n).tolist()}
               for n in rng.integers(3, 40, size=6)]
    ids = [p["prompt_token_ids"] for p in prompts]
    base_toks = [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy(24))]
    alone = {}
    for req in reqs[1:]:
        outs = llm.generate(prompts, _greedy(24), lora_request=req)
        check_against_peft(outs, base_toks, ids, base, req.lora_path, 0.01,
                           f"adapter {req.lora_name} at tp={tp} pp={pp}")
        alone[req.lora_int_id] = [o.outputs[0].token_ids for o in outs]
    alone[None] = base_toks
    mixed = [reqs[i % len(reqs)] for i in range(len(prompts))]
    outs = llm.generate(prompts, _greedy(24), lora_request=mixed)
    for i, (req, out) in enumerate(zip(mixed, outs)):
        assert out.outputs[0].token_ids == alone[None if req is None else req.lora_int_id][i]


def test_prompt_logprobs_follow_the_ranks(ckpt_dir):
    """Prompt logprobs (rank 0's compute_logits called chunk by chunk over a long prompt, each
    call followed by the other ranks) match tp=1's."""
    from vllmx import LLM, SamplingParams

    path = make_checkpoint("llama", "float32", ckpt_dir)
    ids = np.random.default_rng().integers(3, VOCAB, size=300).tolist()  # > one 256-row chunk
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=3)
    runs = []
    for tp in (1, 2):
        llm = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=tp)
        out = llm.generate([{"prompt_token_ids": ids}], sp)[0]
        runs.append([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])])
        del llm
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-4, atol=1e-4)


def test_structured_output_on_the_default_model(smollm2_gguf):
    """A regex-constrained request on SmolLM2 at tp=3 (the mask applied by rank 0 to whole
    logits): tp=1's text, matching the regex."""
    import re

    from vllmx import LLM, SamplingParams
    from vllmx.sampling_params import StructuredOutputsParams

    sp = SamplingParams(temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(
        regex="[a-c]{3}-[0-9]{2}"))
    texts = []
    for tp in (1, 3):
        llm = LLM(smollm2_gguf, max_model_len=256, kv_cache_memory_bytes=16 << 20,
                  tensor_parallel_size=tp)
        texts.append(llm.generate(["Write a code:"], sp)[0].outputs[0].text)
        del llm
    assert texts[1] == texts[0] and re.fullmatch("[a-c]{3}-[0-9]{2}", texts[1]), texts


def test_dead_rank_fails_the_engine(ckpt_dir):
    from vllmx import LLM

    llm = LLM(make_checkpoint("llama", "float32", ckpt_dir), skip_tokenizer_init=True,
              tensor_parallel_size=2)
    executor = llm.llm_engine.worker.executor
    prompt = [{"prompt_token_ids": [5, 6, 7]}]
    assert len(llm.generate(prompt, _greedy(4))[0].outputs[0].token_ids) == 4
    os.kill(executor.procs[1].pid, signal.SIGKILL)
    t0 = time.perf_counter()
    with pytest.raises(Exception, match="rank 1"):
        llm.generate(prompt, _greedy(4))
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("family,tp,pp,what", [
    ("llama", 3, 1, "tensor_parallel_size=3 must divide num_attention_heads"),
    ("gpt2", 1, 2, "tensor / pipeline parallelism supports"),
    ("llama", 1, 3, "pipeline_parallel_size=3 is more than the model's 2 layers"),
    ("gpt2", 2, 1, "tensor / pipeline parallelism supports"),
    ("olmo2", 4, 1, "cannot norm k over the whole width at tensor_parallel_size=4"),
])
def test_what_does_not_split_is_refused(family, tp, pp, what, ckpt_dir):
    from vllmx import LLM

    with pytest.raises(ValueError, match=what):
        LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True,
            tensor_parallel_size=tp, pipeline_parallel_size=pp)


def test_unsupported_combinations_are_refused(ckpt_dir):
    from vllmx import LLM

    path = make_checkpoint("llama", "float32", ckpt_dir)
    with pytest.raises(ValueError, match="not 'mtp'"):
        LLM(path, skip_tokenizer_init=True, pipeline_parallel_size=2,
            speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    with pytest.raises(ValueError, match="'uni' runs one rank"):
        LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2,
            distributed_executor_backend="uni")


def test_ray_backend_drives_tensor_parallelism(ckpt_dir):
    """distributed_executor_backend="ray": a local Ray cluster of CPU workers launches rank 1;
    the tokens are those of the "mp" backend."""
    ray = pytest.importorskip("ray")
    from vllmx import LLM

    path = make_checkpoint("llama", "float32", ckpt_dir)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": list(range(3, 40))}]
    ref = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2)
    expected = [o.outputs[0].token_ids for o in ref.generate(prompts, _greedy())]
    del ref
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        llm = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2,
                  distributed_executor_backend="ray")
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())] == expected
        del llm
    finally:
        ray.shutdown()


def test_ctrl_c_does_not_stop_the_ranks(ckpt_dir):
    """SIGINT reaches the ranks too (one process group at a terminal): they leave it to rank
    0, so an interrupted script's engine keeps working."""
    from vllmx import LLM

    llm = LLM(make_checkpoint("llama", "float32", ckpt_dir), skip_tokenizer_init=True,
              tensor_parallel_size=2)
    prompt = [{"prompt_token_ids": [5, 6, 7]}]
    first = llm.generate(prompt, _greedy(4))[0].outputs[0].token_ids
    os.kill(llm.llm_engine.worker.executor.procs[1].pid, signal.SIGINT)
    time.sleep(0.5)
    assert llm.generate(prompt, _greedy(4))[0].outputs[0].token_ids == first
