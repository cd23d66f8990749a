"""LoRA on the GPU: add_lora_linear (cuda/lora.cu) against the float64 reference on the values
the GPU was given (f32 within f32 rounding, bf16 / f16 within one rounding of the output), rows
of several slots and none, 1-3 output slices, batch invariance; end to end, PEFT adapters on a
tiny Llama on the GPU in f32 against transformers + peft (delta 0.01), bf16 mixed batches equal
to each request alone, and CUDA graphs on equal to eager."""
import os

import numpy as np
import pytest

from tests.ops.test_lora import make, reference
from vllmx import _C
from vllmx.device import BF16, F16, F32, I32, DeviceArray

from .test_cuda_ops import as_f32, dev, rounded

pytestmark = pytest.mark.gpu
SEED = int.from_bytes(os.urandom(4), "little")


def run_op(y, x, a, b, idx, slices, dtype):
    yd = dev(y, dtype)
    _C.ops.add_lora_linear(yd, dev(x, dtype), dev(a, dtype), dev(b, dtype),
                           DeviceArray.from_numpy(idx, I32),
                           DeviceArray.from_numpy(slices, I32))
    return as_f32(yd.numpy(), dtype)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(1, 8, 64, (96,), 1), (4, 16, 576, (576, 192, 192), 32),
                                   (3, 16, 4096, (6144, 1024, 1024), 7),
                                   (2, 4, 1000, (576,), 5), (4, 16, 512, (1536, 1536), 64)],
                         ids=lambda s: "L{}r{}K{}N{}T{}".format(*s))
def test_vs_float64(shape, dtype):
    rng = np.random.default_rng()
    a, b, x, y, idx, slices = make(rng, *shape)
    a, b, x, y = (rounded(v, dtype) for v in (a, b, x, y))  # the values the GPU is given
    want = reference(y, x, a, b, idx, slices)
    got = run_op(y, x, a, b, idx, slices, dtype)
    tol = 2e-6 if dtype == F32 else 2 ** (-7 if dtype == BF16 else -10)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, err
    base = idx < 0
    assert np.array_equal(got[base], y[base])


def test_batch_invariance():
    rng = np.random.default_rng()
    a, b, x, y, idx, slices = make(rng, 4, 16, 2048, (2048, 512, 512), 48)
    full = run_op(y, x, a, b, idx, slices, BF16)
    for t in (0, 17, 47):
        alone = run_op(y[t:t + 1], x[t:t + 1], a, b, idx[t:t + 1], slices, BF16)
        assert np.array_equal(alone[0], full[t]), t


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    pytest.importorskip("peft")
    from tests.lora.adapters import make_adapter
    from tests.models.tiny_checkpoints import make_checkpoint

    out = str(tmp_path_factory.mktemp("lora-gpu"))
    base = make_checkpoint("llama", "float32", out)
    return base, [make_adapter(base, out, name, seed=i) for i, name in
                  enumerate(("all", "qv", "mlp"))]


def greedy(n=24):
    from vllmx import SamplingParams

    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def prompts(n=8):
    from tests.models.tiny_checkpoints import VOCAB

    rng = np.random.default_rng(SEED)
    return [rng.integers(3, VOCAB, size=k).tolist() for k in rng.integers(3, 40, size=n)]


def test_f32_parity_with_peft_on_gpu(lora_setup):
    from tests.lora.adapters import check_against_peft
    from vllmx import LLM
    from vllmx.lora.request import LoRARequest

    base, paths = lora_setup
    llm = LLM(base, device="cuda", dtype="float32", skip_tokenizer_init=True,
              kv_cache_dtype="float32", enable_lora=True, max_loras=3, max_lora_rank=16)
    ps = prompts()
    base_toks = [o.outputs[0].token_ids for o in
                 llm.generate([{"prompt_token_ids": p} for p in ps], greedy())]
    for i, path in enumerate(paths):
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(),
                            lora_request=LoRARequest(f"a{i}", i + 1, path))
        check_against_peft(outs, base_toks, ps, base, path, 0.01, f"adapter {i} (seed {SEED})")


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_bf16_mixed_batch_equals_alone(lora_setup, eager):
    from vllmx import LLM
    from vllmx.lora.request import LoRARequest

    base, paths = lora_setup
    # (a fixed cache: a second engine shares the GPU below)
    llm = LLM(base, device="cuda", dtype="bfloat16", skip_tokenizer_init=True,
              enable_lora=True, max_loras=2, max_lora_rank=16, enforce_eager=eager,
              enable_prefix_caching=False, kv_cache_memory_bytes=256 << 20)
    reqs = [None] + [LoRARequest(f"a{i}", i + 1, p) for i, p in enumerate(paths)]
    ps = prompts(12)
    loras = [reqs[i % len(reqs)] for i in range(len(ps))]
    mixed = llm.generate([{"prompt_token_ids": p} for p in ps], greedy(), lora_request=loras)
    for p, lora, out in zip(ps, loras, mixed):
        alone = llm.generate([{"prompt_token_ids": p}], greedy(), lora_request=lora)
        assert out.outputs[0].token_ids == alone[0].outputs[0].token_ids, (SEED, lora)
    if not eager:
        other = LLM(base, device="cuda", dtype="bfloat16", skip_tokenizer_init=True,
                    enable_lora=True, max_loras=2, max_lora_rank=16, enforce_eager=True,
                    enable_prefix_caching=False, kv_cache_memory_bytes=256 << 20)
        want = other.generate([{"prompt_token_ids": p} for p in ps], greedy(),
                              lora_request=loras)
        assert [o.outputs[0].token_ids for o in mixed] == [o.outputs[0].token_ids
                                                             for o in want]
