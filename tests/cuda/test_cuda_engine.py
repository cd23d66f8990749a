"""The engine on the GPU: token parity against transformers on the same GPU for tiny random
Llama and Qwen3 checkpoints (bf16: delta 0.5 nats; f32: delta 0.01), CUDA graphs on vs off give
identical tokens, and the engine's batching test (batched == alone) holds on the GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.models.parity import check_positions, log_softmax

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 512
SEED = int.from_bytes(os.urandom(4), "little")  # fresh prompts each run, printed on failure


def _config(family: str):
    # head_dim 64 (Llama) and 128 (Qwen3): the tensor-core attention paths, not the generic one.
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  bos_token_id=1, eos_token_id=2)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    return transformers.Qwen3Config(**{**common, "head_dim": 128}, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    root = tmp_path_factory.mktemp("gpu-ckpt")
    for family in ("llama", "qwen3"):
        torch.manual_seed(1234)
        model = transformers.AutoModelForCausalLM.from_config(_config(family)).eval()
        with torch.no_grad():  # widen the near-uniform logits of a random init
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(4.0)
        path = str(root / family)
        model.to(torch.bfloat16).save_pretrained(path)
        out[family] = path
    return out


def _prompts(rng, n=8):
    lens = rng.integers(3, 200, size=n)
    lens[0] = 300  # several KV blocks and decode partitions
    return [rng.integers(3, VOCAB, size=int(k)).tolist() for k in lens]


def _llm(path, **kw):
    from vllmx import LLM

    kw.setdefault("kv_cache_memory_bytes", 256 << 20)
    return LLM(path, skip_tokenizer_init=True, device="cuda", max_model_len=1024, **kw)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype,delta", [("bfloat16", 0.5), ("float32", 0.01)])
def test_token_parity_vs_transformers_on_gpu(checkpoints, family, dtype, delta):
    from vllmx import SamplingParams

    rng = np.random.default_rng(SEED)
    prompts = _prompts(rng)
    llm = _llm(checkpoints[family], dtype=dtype)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints[family], dtype=getattr(torch, dtype), attn_implementation="sdpa").cuda().eval()
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        assert len(toks) == 32
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device="cuda")).logits[0]
        lp = log_softmax(logits.double().cpu().numpy())
        report = check_positions(lp[len(prompt) - 1:-1], toks, delta)
        assert report.failed == 0, f"{family} {dtype} (seed {SEED}, len {len(prompt)}): {report}"


@pytest.mark.parametrize("decode", ["split", "balanced"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_large_decode_batch_parity_on_gpu(checkpoints, family, decode):
    """A decode batch of more attention CTAs than stay resident (140 sequences x 2 kv heads on
    an H100 / H200's 132 SMs, two CTAs an SM) on each decode kernel, in the captured graphs,
    token for token with transformers (bf16, delta 0.5)."""
    from vllmx import SamplingParams, _C

    rng = np.random.default_rng(SEED)
    prompts = _prompts(rng, 140)
    _C.cuda_attention_tuning(decode)
    try:
        llm = _llm(checkpoints[family], max_num_seqs=160, max_num_batched_tokens=8192)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    finally:
        _C.cuda_attention_tuning()
    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints[family], dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        toks = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device="cuda")).logits[0]
        lp = log_softmax(logits.double().cpu().numpy())
        report = check_positions(lp[len(prompt) - 1:-1], toks, 0.5)
        assert report.failed == 0, f"{family} request {i} (seed {SEED}): {report}"


def test_graphs_on_and_off_give_identical_tokens(checkpoints):
    from vllmx import SamplingParams

    rng = np.random.default_rng(SEED)
    prompts = [{"prompt_token_ids": p} for p in _prompts(rng, 13)]
    params = [SamplingParams(temperature=0, max_tokens=int(rng.integers(5, 40)), ignore_eos=True)
              if i % 2 else SamplingParams(temperature=0.8, top_p=0.9, seed=i,
                                           max_tokens=int(rng.integers(5, 40)), ignore_eos=True)
              for i in range(len(prompts))]
    results = []
    for eager in (False, True):
        llm = _llm(checkpoints["qwen3"], enforce_eager=eager, max_num_seqs=16)
        assert bool(llm.llm_engine.model_runner.decode_capture.steps) != eager
        results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        del llm
    assert results[0] == results[1], f"seed {SEED}"


def test_batched_equal_alone_on_gpu(tmp_path):
    """tests/engine/test_batch_invariance.py on the GPU, in f32 (whose kernels are batch
    invariant: bf16 GEMM and GEMV sum in different orders)."""
    from tests.engine.test_batch_invariance import make_requests
    from tests.models.tiny_checkpoints import make_checkpoint
    from vllmx import LLM, SamplingParams

    path = make_checkpoint("qwen3", "float32", str(tmp_path))
    rng = np.random.default_rng()
    reqs = make_requests(rng)
    llm = LLM(path, skip_tokenizer_init=True, device="cuda", dtype="float32", max_num_seqs=6,
              max_num_batched_tokens=64, num_gpu_blocks_override=14, block_size=16,
              max_model_len=224)
    greedy = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    seeded = [SamplingParams(temperature=0.9, top_k=40, seed=100 + i, max_tokens=n,
                             ignore_eos=True) for i, (_, n) in enumerate(reqs)]
    prompts = [p for p, _ in reqs]
    batched = llm.generate(prompts, greedy)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    batched_seeded = llm.generate(prompts, seeded)
    llm.reset_prefix_cache()
    for i, p in enumerate(prompts):
        assert (llm.generate([p], [greedy[i]])[0].outputs[0].token_ids
                == batched[i].outputs[0].token_ids), f"request {i}"
        assert (llm.generate([p], [seeded[i]])[0].outputs[0].token_ids
                == batched_seeded[i].outputs[0].token_ids), f"seeded request {i}"


def test_one_sequence_engine_on_gpu(checkpoints):
    """max_num_seqs=1 with a short max_model_len: the start-up profile forms only the steps the
    scheduler can (it once split max_num_batched_tokens over more sequences than that), and
    each request gets the tokens it gets alone in the default engine."""
    from vllmx import LLM, SamplingParams

    rng = np.random.default_rng(SEED)
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, size=n).tolist()} for n in (80, 5, 33)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    one = LLM(checkpoints["qwen3"], skip_tokenizer_init=True, device="cuda", max_num_seqs=1,
              max_model_len=96, kv_cache_memory_bytes=64 << 20).generate(prompts, params)
    ref = _llm(checkpoints["qwen3"])
    for p, o in zip(prompts, one):
        assert len(o.outputs[0].token_ids) == 12
        assert o.outputs[0].token_ids == ref.generate([p], params)[0].outputs[0].token_ids


def test_cpu_and_gpu_sample_the_same_seeded_stream(checkpoints):
    """f32 on both devices: seeded sampling draws the same tokens (one xoroshiro128++ stream)."""
    from vllmx import LLM, SamplingParams

    prompts = [{"prompt_token_ids": p} for p in _prompts(np.random.default_rng(SEED), 4)]
    params = SamplingParams(temperature=1.0, top_k=50, seed=7, max_tokens=16, ignore_eos=True)
    gpu = _llm(checkpoints["llama"], dtype="float32").generate(prompts, params)
    cpu = LLM(checkpoints["llama"], skip_tokenizer_init=True, device="cpu", max_model_len=1024,
              kv_cache_dtype="float32").generate(prompts, params)
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(gpu, cpu))
    assert same >= 3, f"only {same}/4 seeded requests agree between CPU and GPU (seed {SEED})"


def test_model_that_does_not_fit_is_a_clear_error(checkpoints):
    with pytest.raises(ValueError, match="does not fit"):
        _llm(checkpoints["llama"], kv_cache_memory_bytes=None, gpu_memory_utilization=0.0001)


def _dequantized_oracle(path: str, qtype: str, dtype: str):
    """transformers on the checkpoint with each matrix replaced by gguf's dequantization of its
    quantized rows: the model a GGUF of one block type holds (rows are quantized alone, so the
    GGUF's q / k row order is moot)."""
    from gguf import GGMLQuantizationType, quants

    from vllmx import ops

    oracle = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for p in oracle.parameters():
            if p.dim() == 2:
                w = p.numpy()
                blocks = ops.quantize_weight(w, ops.QUANTIZE_TYPES[qtype])
                p.copy_(torch.from_numpy(quants.dequantize(
                    blocks, GGMLQuantizationType[qtype]).reshape(w.shape)))
    return oracle.to(getattr(torch, dtype)).cuda()


@pytest.mark.parametrize("dtype,delta", [("bfloat16", 0.5), ("float16", 0.5), ("float32", 0.01)])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q8_0"])
def test_quantized_gguf_on_gpu_is_its_dequantized_model(checkpoints, tmp_path, qtype, dtype,
                                                        delta):
    """A GGUF of one block type (every matrix, the embedding and lm_head included) on the GPU
    in bf16 / f16 (the GEMV, the quantized skinny GEMM, the mma.sync GEMMs) or f32 (the generic
    kernel): token parity at the dense models' deltas with transformers running the model of
    its dequantized weights (the GPU dequantizes exactly and does not quantize activations). A
    wrong scale, sub-block or nibble order is nats away; so, in f32, is an embedding whose rows
    come out rounded to bf16 (0.08 nats here, before embeddings took the activation dtype)."""
    from tests.cli.test_quantize import write_tokenizer
    from vllmx import SamplingParams
    from vllmx.cli.main import main

    write_tokenizer(checkpoints["llama"])
    path = str(tmp_path / f"llama-{qtype}.gguf")
    assert main(["quantize", checkpoints["llama"], path, "--type", qtype]) == 0
    rng = np.random.default_rng(SEED)
    prompts = _prompts(rng)
    outs = _llm(path, dtype=dtype).generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    oracle = _dequantized_oracle(checkpoints["llama"], qtype, dtype)
    for prompt, out in zip(prompts, outs):
        toks = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = oracle(torch.tensor([prompt + toks], device="cuda")).logits[0]
        report = check_positions(log_softmax(logits.double().cpu().numpy())[len(prompt) - 1:-1],
                                 toks, delta)
        assert report.failed == 0, f"{qtype} {dtype} (seed {SEED}, len {len(prompt)}): {report}"


def test_unsupported_weight_type_on_gpu_names_it(checkpoints, tmp_path):
    from tests.cli.test_quantize import write_tokenizer
    from vllmx import LLM
    from vllmx.cli.main import main

    write_tokenizer(checkpoints["llama"])
    path = str(tmp_path / "llama-Q2_K.gguf")
    assert main(["quantize", checkpoints["llama"], path, "--type", "Q2_K"]) == 0
    with pytest.raises(ValueError, match="GGUF type Q2_K has no CUDA kernel.*device='cpu'"):
        LLM(path, device="cuda", max_model_len=256, kv_cache_memory_bytes=64 << 20)


@pytest.mark.parametrize("kinds", [(0, 1, 4, 5), (0, 1, 2, 3, 4, 5)])
def test_async_scheduling_equals_sync_on_gpu(checkpoints, kinds):
    """Step N + 1 launched before step N's tokens reach the host (its input ids scattered on
    the GPU from where step N sampled them) gives every request the outputs synchronous
    scheduling gives; without requests that read tokens on the host, every decode step after
    the first overlaps. In f32, whose kernels are batch invariant: a request that stopped in
    step N still rides in step N + 1, so the batches differ (bf16's async path is covered by
    the parity test against transformers, which runs with async scheduling on)."""
    from tests.engine.test_async_scheduling import check_async_matches_sync

    rng = np.random.default_rng(SEED)
    n = check_async_matches_sync(checkpoints["qwen3"], "cuda", rng, kinds, dtype="float32",
                                 max_num_seqs=32, kv_cache_memory_bytes=256 << 20,
                                 max_model_len=1024)
    if 2 not in kinds:
        assert n > 10


def test_two_engines_with_graphs_in_one_process(checkpoints):
    """A graph replays over the blocks its capture used, after the host freed them: those
    must never go to a later allocation (here a second engine's weights and cache, made after
    the first one captured), or the first engine's replays overwrite them."""
    from vllmx import SamplingParams

    rng = np.random.default_rng(SEED)
    prompts = [{"prompt_token_ids": p} for p in _prompts(rng, 8)]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    a = _llm(checkpoints["qwen3"], max_num_seqs=8)
    want = [o.outputs[0].token_ids for o in a.generate(prompts, sp)]
    b = _llm(checkpoints["qwen3"], max_num_seqs=8)
    assert [o.outputs[0].token_ids for o in a.generate(prompts, sp)] == want
    assert [o.outputs[0].token_ids for o in b.generate(prompts, sp)] == want
