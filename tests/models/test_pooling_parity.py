"""Embeddings against sentence-transformers on the same checkpoint (TESTING.md: cosine >= 0.9999
in f32): the real MiniLM, and tiny random BERT / BERT-MLM / XLM-R / Qwen3 checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.pooling_checkpoints import make_st_checkpoint

TEXTS = ["The capital of France is Paris.", "A man is eating food.", "hello",
         ("Quantum chromodynamics describes the strong interaction between quarks and gluons, "
          "the fundamental constituents of hadrons such as the proton and the neutron."),
         "A", "Embeddings map text to vectors; similar texts map to nearby vectors."]


def _cosines(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)


def _st_embed(path: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu").encode(texts, convert_to_numpy=True)


def _check(path: str, **llm_kwargs) -> None:
    from vllmx import LLM

    ref = _st_embed(path, TEXTS)
    llm = LLM(path, **llm_kwargs)
    outs = llm.embed(TEXTS)
    got = np.array([o.outputs.embedding for o in outs], dtype=np.float32)
    assert got.shape == ref.shape
    cos = _cosines(got, ref)
    assert cos.min() >= 0.9999, cos
    # Both normalize: the vectors agree element by element as well, not only in direction.
    np.testing.assert_allclose(got, ref, atol=1e-4)
    # and differ between texts (a model that ignored its input would pass the above)
    assert _cosines(got[:1].repeat(len(got) - 1, 0), got[1:]).max() < 0.9999


def test_minilm_matches_sentence_transformers(minilm_dir):
    _check(minilm_dir)


@pytest.mark.parametrize("kind", ["bert", "bert_mlm", "xlmr", "qwen3"])
def test_tiny_checkpoint_matches_sentence_transformers(kind, minilm_dir, tmp_path):
    path = make_st_checkpoint(kind, str(tmp_path / kind), minilm_dir)
    _check(path, **({"runner": "pooling"} if kind == "bert_mlm" else {}))


def test_batches_split_by_token_budget(minilm_dir):
    """max_num_batched_tokens smaller than the prompts: several forwards, same vectors."""
    from vllmx import LLM

    ref = np.array([o.outputs.embedding for o in LLM(minilm_dir).embed(TEXTS)])
    small = LLM(minilm_dir, max_num_batched_tokens=40, max_num_seqs=2)
    got = np.array([o.outputs.embedding for o in small.embed(TEXTS)])
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_token_embed_matches_sentence_transformers(minilm_dir):
    """LLM.encode(pooling_task="token_embed"): every token's final hidden state (normalized,
    vLLM's default), as sentence-transformers' token_embeddings."""
    from sentence_transformers import SentenceTransformer

    from vllmx import LLM

    st = SentenceTransformer(minilm_dir, device="cpu")
    refs = st.encode(TEXTS[:3], output_value="token_embeddings")
    outs = LLM(minilm_dir).encode(TEXTS[:3], pooling_task="token_embed")
    for out, ref in zip(outs, refs):
        ref = ref.numpy()
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        assert out.outputs.data.shape == ref.shape == (len(out.prompt_token_ids), 384)
        np.testing.assert_allclose(out.outputs.data, ref, atol=1e-4)
