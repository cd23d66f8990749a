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
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-tp"))


# llama at tp=4: 2 kv heads for 4 ranks (each kv head on two ranks); qwen3: tied embeddings,
# q/k norms; qwen3_moe: sparse and dense layers; mixtral: experts w1/w2/w3.
@pytest.mark.parametrize("family,tp", [("llama", 2), ("llama", 4), ("qwen3", 2),
                                       ("qwen3_moe", 2), ("mixtral", 2)])
def test_parity(family, tp, ckpt_dir):
    path = make_checkpoint(family, "float32", ckpt_dir)
    llm, _, _ = run_parity(path, path, tensor_parallel_size=tp)
    cfg = llm.llm_engine.model.config  # rank 0's share
    assert cfg["tp_size"] == tp and cfg["num_attention_heads"] == 4 // tp
    k_cache, _ = llm.llm_engine.kv_caches[0]
    assert k_cache.shape[2] == max(1, 2 // tp)  # this rank's kv heads only


def _greedy(max_tokens=16):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_batched_equals_alone(ckpt_dir):
    from vllmx import LLM

    path = make_checkpoint("llama", "float32", ckpt_dir)
    llm = LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2,
              num_gpu_blocks_override=40, block_size=16, max_num_batched_tokens=64,
              max_num_seqs=8)
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, size=n).tolist()}
               for n in rng.integers(20, 150, size=8)]
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, _greedy())]
    alone = [llm.generate([p], _greedy())[0].outputs[0].token_ids for p in prompts]
    assert batched == alone


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


@pytest.mark.parametrize("family,tp,what", [
    ("llama", 3, "tensor_parallel_size=3 must divide num_attention_heads"),
    ("gpt2", 2, "tensor_parallel_size > 1 supports"),
])
def test_what_does_not_split_is_refused(family, tp, what, ckpt_dir):
    from vllmx import LLM

    with pytest.raises(ValueError, match=what):
        LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True,
            tensor_parallel_size=tp)


def test_unsupported_combinations_are_refused(ckpt_dir):
    from vllmx import LLM

    path = make_checkpoint("llama", "float32", ckpt_dir)
    with pytest.raises(ValueError, match="LoRA"):
        LLM(path, skip_tokenizer_init=True, tensor_parallel_size=2, enable_lora=True)
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
