"""Pooling models on the GPU against transformers on the CPU: tiny random BERT (mean pooling),
XLM-R (CLS) and Qwen3 (last token) embedders and BERT / XLM-R cross-encoders, on token-id
prompts (the GPU machine has no tokenizer to give them). f32 (dtype="float32": the exact
kernels) within TESTING.md's cosine >= 0.9999; bf16, vLLM's dtype="auto" for these f32
checkpoints, within 0.99. Head sizes 16 (the generic attention kernel) and 64 (the tensor-core
decode kernel each encoder row runs as)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.pooling_checkpoints import KINDS, VOCAB, make_hf_checkpoint

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

POOLING = {"bert": "MEAN", "xlmr": "CLS", "qwen3": "LAST"}
LENS = [5, 17, 1, 40, 64, 33, 2]
# head size 64: hidden 256 over 4 heads (Qwen3's head_dim is its own key)
WIDE = {"bert": {"hidden_size": 256}, "xlmr": {"hidden_size": 256},
        "qwen3": {"hidden_size": 256, "head_dim": 64}, "bert_cls": {"hidden_size": 256},
        "xlmr_cls": {"hidden_size": 256}}
MIN_COSINE = {"float32": 0.9999, "auto": 0.99}


def _prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # ids from 3 up: none is a padding id (XLM-R's 1 would move its positions)
    return [rng.integers(3, VOCAB, n).tolist() for n in LENS]


def _hf_outputs(path: str, kind: str, prompts: list[list[int]]) -> list[np.ndarray]:
    """transformers on the CPU in f32, one prompt at a time: its last hidden states, or a
    classifier's logits."""
    model = getattr(transformers, KINDS[kind][0]).from_pretrained(
        path, torch_dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            out = model(input_ids=torch.tensor([ids]))
            outs.append((out.logits if kind.endswith("_cls") else out.last_hidden_state)[0]
                        .double().numpy())
    return outs


def _pool(h: np.ndarray, pooling: str) -> np.ndarray:
    v = {"MEAN": h.mean(0), "CLS": h[0], "LAST": h[-1]}[pooling]
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("dtype", ["float32", "auto"])
@pytest.mark.parametrize("wide", [False, True], ids=["d16", "d64"])
@pytest.mark.parametrize("kind", list(POOLING))
def test_embeddings_match_transformers(kind, wide, dtype, tmp_path):
    from vllmx import LLM

    path = make_hf_checkpoint(kind, str(tmp_path / kind), None, **(WIDE[kind] if wide else {}))
    prompts = _prompts(len(kind) + wide)
    ref = np.array([_pool(h, POOLING[kind]) for h in _hf_outputs(path, kind, prompts)])
    llm = LLM(path, device="cuda", dtype=dtype, runner="pooling",
              pooler_config={"pooling_type": POOLING[kind], "normalize": True})
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts])
    got = np.array([o.outputs.embedding for o in outs], dtype=np.float64)
    assert got.shape == ref.shape
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= MIN_COSINE[dtype], cos
    # the prompts' vectors differ (a model that ignored its input would pass the above)
    assert (got[1:] @ got[0]).max() < 0.9999
    if dtype == "float32":
        np.testing.assert_allclose(got, ref, atol=1e-4)


def test_token_embeddings_and_batches_split_by_budget(tmp_path):
    """Every token's hidden state (token_embed), and forwards of at most 40 tokens giving the
    vectors one forward gives."""
    from vllmx import LLM

    path = make_hf_checkpoint("bert", str(tmp_path / "bert"), None, **WIDE["bert"])
    prompts = _prompts(7)
    refs = _hf_outputs(path, "bert", prompts)
    kw = {"device": "cuda", "dtype": "float32", "runner": "pooling",
          "pooler_config": {"pooling_type": "MEAN", "normalize": True}}
    toks = LLM(path, **kw).encode([{"prompt_token_ids": p} for p in prompts],
                                  pooling_task="token_embed")
    for out, ref in zip(toks, refs):
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        assert out.outputs.data.shape == ref.shape
        np.testing.assert_allclose(out.outputs.data, ref, atol=1e-4)
    whole = LLM(path, **kw).embed([{"prompt_token_ids": p} for p in prompts])
    small = LLM(path, max_num_batched_tokens=64, max_num_seqs=2, **kw).embed(
        [{"prompt_token_ids": p} for p in prompts])
    np.testing.assert_allclose([o.outputs.embedding for o in small],
                               [o.outputs.embedding for o in whole], atol=1e-6)


@pytest.mark.parametrize("kind", ["bert_cls", "xlmr_cls"])
def test_cross_encoder_probs_match_transformers(kind, tmp_path):
    from vllmx import LLM

    path = make_hf_checkpoint(kind, str(tmp_path / kind), None, **WIDE[kind])
    prompts = _prompts(11)
    logits = np.array(_hf_outputs(path, kind, prompts))
    llm = LLM(path, device="cuda", dtype="float32")
    probs = np.array([o.outputs.probs for o in llm.classify(
        [{"prompt_token_ids": p} for p in prompts])])
    want = (1 / (1 + np.exp(-logits)) if logits.shape[1] == 1 else
            np.exp(logits) / np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(probs, want, rtol=1e-4, atol=1e-6)
