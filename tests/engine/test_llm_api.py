"""The LLM API on tiny checkpoints: prompt forms, batching through the paged cache, sampling
settings, and clear ValueErrors for bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return make_checkpoint("llama", "float32", str(tmp_path_factory.mktemp("api")))


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from vllmx import LLM

    # A small pool and budget so that chunked prefill and preemption both happen.
    return LLM(tiny_llama, skip_tokenizer_init=True, num_gpu_blocks_override=40, block_size=16,
               max_num_batched_tokens=64, max_num_seqs=8)


def greedy(max_tokens=24):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_batched_equals_alone(llm):
    """Greedy tokens of each request are the same alone and batched, with chunked prefill
    (budget 64 < prompt 150) and preemption (40 blocks cannot hold all 8 at full length)."""
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, n).tolist()}
               for n in (150, 5, 40, 77, 12, 3, 100, 60)]
    batched = llm.generate(prompts, greedy())
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for p, out in zip(prompts, batched):
        alone = llm.generate([p], greedy())[0]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids
        assert out.prompt_token_ids == p["prompt_token_ids"]
        assert out.finished and out.outputs[0].finish_reason == "length"
    assert llm.llm_engine.scheduler.kv_cache_manager.num_free_blocks == 40


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    from vllmx import SamplingParams

    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, 20).tolist()} for _ in range(4)]
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, seed=7,
                        ignore_eos=True)
    a = llm.generate(prompts, sp)
    b = llm.generate(prompts[2:3], sp)
    assert a[2].outputs[0].token_ids == b[0].outputs[0].token_ids
    unseeded = llm.generate(prompts[:1] * 2, SamplingParams(temperature=1.0, max_tokens=16,
                                                             ignore_eos=True))
    assert unseeded[0].outputs[0].token_ids != unseeded[1].outputs[0].token_ids


def test_stop_token_ids_and_min_tokens(llm):
    from vllmx import SamplingParams

    p = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    toks = llm.generate([p], greedy(12))[0].outputs[0].token_ids
    stop = toks[3]
    first = toks.index(stop)
    out = llm.generate([p], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop],
                                           ignore_eos=True))[0].outputs[0]
    assert out.token_ids == toks[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    out = llm.generate([p], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop],
                                           min_tokens=first + 2, ignore_eos=True))[0].outputs[0]
    assert stop not in out.token_ids[: first + 2]


def test_text_prompt_without_tokenizer_is_rejected(llm):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate("hello", greedy())


def test_prompt_longer_than_context_is_rejected(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([{"prompt_token_ids": [3] * 600}], greedy())


def test_out_of_vocab_token_is_rejected(llm):
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([{"prompt_token_ids": [3, VOCAB + 5]}], greedy())


def test_missing_model_path():
    from vllmx import LLM

    with pytest.raises(ValueError, match="not found"):
        LLM("/nonexistent/model-dir")


def test_unknown_architecture(tiny_llama, tmp_path):
    import shutil

    from vllmx import LLM

    d = tmp_path / "weird"
    shutil.copytree(tiny_llama, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="FancyNewForCausalLM"):
        LLM(str(d), skip_tokenizer_init=True)


def test_unsupported_gguf_block_type(tmp_path):
    """A tensor of a GGUF type id vllmx cannot run fails loudly, naming the id. Every block type
    of the gguf package is supported, so the tensor gets id 4: Q4_2, long removed from ggml."""
    import struct

    import gguf

    from vllmx import LLM

    path = tmp_path / "q4_2.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    data = np.zeros((4, 34), dtype=np.uint8)  # 4 rows of one Q8_0 block, retyped below
    w.add_tensor("token_embd.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # Tensor info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64).
    b = bytearray(path.read_bytes())
    at = b.index(b"token_embd.weight") + len(b"token_embd.weight")
    type_at = at + 4 + 8 * struct.unpack_from("<I", b, at)[0]
    assert struct.unpack_from("<I", b, type_at)[0] == int(gguf.GGMLQuantizationType.Q8_0)
    struct.pack_into("<I", b, type_at, 4)
    path.write_bytes(bytes(b))
    with pytest.raises(ValueError, match=r"q4_2\.gguf.*\b4\b"):
        LLM(str(path), skip_tokenizer_init=True)


def test_unsupported_gguf_tensor_type(tmp_path):
    """A type the gguf package knows but vllmx has no kernels for is named in the error."""
    import gguf

    from vllmx import LLM

    path = str(tmp_path / "f64.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="F64"):
        LLM(path, skip_tokenizer_init=True)


def test_unknown_gguf_architecture(tmp_path):
    import gguf

    from vllmx import LLM

    path = str(tmp_path / "mamba.gguf")
    w = gguf.GGUFWriter(path, "mamba")
    w.add_tensor("token_embd.weight", np.ones((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="mamba"):
        LLM(path, skip_tokenizer_init=True)


def test_bad_sampling_params():
    from vllmx import SamplingParams

    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_import_does_not_load_torch():
    import subprocess
    import sys

    code = "import sys, vllmx; from vllmx import LLM, SamplingParams; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    from vllmx import SamplingParams

    prompt = list(range(3, 103))
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, truncate_prompt_tokens=20)
    out = llm.generate([{"prompt_token_ids": prompt}], sp)[0]
    assert out.prompt_token_ids == prompt[-20:]
    assert out.outputs[0].token_ids == llm.generate([{"prompt_token_ids": prompt[-20:]}],
                                                    greedy(8))[0].outputs[0].token_ids


@pytest.mark.parametrize("dtype,kv", [("bfloat16", "bf16"), ("float16", "f16"), ("half", "f16")])
def test_cpu_runs_vllm_half_dtypes(tiny_llama, dtype, kv):
    """vLLM's `--dtype bfloat16` command lines run on the CPU: activations in float32, the KV
    cache in that dtype; the tokens match an f32-cache run up to the cache's rounding, here
    exactly on a short greedy run of the tiny model."""
    from vllmx import LLM

    from vllmx.device import BF16, F16

    llm = LLM(tiny_llama, skip_tokenizer_init=True, dtype=dtype, device="cpu")
    assert llm.llm_engine.model_runner.cache_dtype == {"bf16": BF16, "f16": F16}[kv]
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], greedy(6))[0].outputs[0].token_ids
    ref = LLM(tiny_llama, skip_tokenizer_init=True, device="cpu", kv_cache_dtype="float32")
    assert out == ref.generate([{"prompt_token_ids": [5, 6, 7]}], greedy(6))[0].outputs[0].token_ids


def test_vllm_arguments_are_honoured_or_refused(tiny_llama):
    from vllmx import LLM

    with pytest.raises(NotImplementedError, match="data_parallel_size=2"):
        LLM(tiny_llama, skip_tokenizer_init=True, data_parallel_size=2)
    with pytest.raises(ValueError, match="dtype='int8' is not a dtype the CPU backend takes"):
        LLM(tiny_llama, skip_tokenizer_init=True, dtype="int8", device="cpu")
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        LLM(tiny_llama, skip_tokenizer_init=True, gpu_memory_utilization=1.5)
    with pytest.raises(TypeError, match="not_an_argument"):
        LLM(tiny_llama, skip_tokenizer_init=True, not_an_argument=1)
    # Zero or negative sizes are refused by name before anything is built from them (they
    # had surfaced as a KV cache of no blocks, a negative array, or a stalled scheduler).
    for name, value in [("max_num_seqs", 0), ("max_num_batched_tokens", 0),
                        ("max_model_len", -3), ("kv_cache_memory_bytes", 0),
                        ("num_gpu_blocks_override", -2), ("num_threads", 0),
                        ("block_size", 0)]:
        with pytest.raises(ValueError, match=f"{name} must be >= 1, got {value}"):
            LLM(tiny_llama, skip_tokenizer_init=True, device="cpu", **{name: value})
    with pytest.raises(ValueError, match="max_logprobs must be >= 0, or -1"):
        LLM(tiny_llama, skip_tokenizer_init=True, device="cpu", max_logprobs=-2)
    with pytest.raises(ValueError, match="max_logprob_entries must be >= 1, got 0"):
        LLM(tiny_llama, skip_tokenizer_init=True, device="cpu", max_logprob_entries=0)
    llm = LLM(tiny_llama, skip_tokenizer_init=True, dtype="auto", tensor_parallel_size=1,
              trust_remote_code=True, enforce_eager=True, device="cpu")
    assert llm.generate([{"prompt_token_ids": [5, 6]}], greedy(4))[0].outputs[0].token_ids


def test_logprob_entries_a_request_may_hold_are_bounded(tiny_llama):
    """Every logprob entry stays in memory until its request ends: the whole vocabulary at
    each position of a long answer took a server past 24 GB. A request whose tokens x
    (logprobs + 1), prompt logprobs and n add up past max_logprob_entries is refused before it
    runs, naming the bound; one at the bound runs, and the engine goes on serving."""
    from vllmx import LLM, SamplingParams

    llm = LLM(tiny_llama, skip_tokenizer_init=True, device="cpu", max_logprobs=-1,
              max_logprob_entries=4 * (VOCAB + 1))
    prompt = [{"prompt_token_ids": [5, 6, 7]}]
    ok = llm.generate(prompt, SamplingParams(max_tokens=4, logprobs=-1, ignore_eos=True))
    assert [len(d) for d in ok[0].outputs[0].logprobs] == [VOCAB] * 4
    over = [SamplingParams(max_tokens=5, logprobs=-1),
            SamplingParams(max_tokens=4, logprobs=-1, n=2),
            SamplingParams(max_tokens=4, logprobs=-1, prompt_logprobs=0),
            SamplingParams(max_tokens=None, logprobs=-1)]  # up to max_model_len tokens
    for params in over:
        with pytest.raises(ValueError, match="max_logprob_entries = " + str(4 * (VOCAB + 1))):
            llm.generate(prompt, params)
    assert llm.generate(prompt, greedy(3))[0].outputs[0].token_ids
