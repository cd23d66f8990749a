"""Cross-encoders and classifiers against transformers on the same checkpoint, embedding-model
scores against sentence-transformers' cosine, a decoder converted to an embedder, Matryoshka
dimensions, and the errors bad input gets."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.pooling_checkpoints import make_hf_checkpoint, make_st_checkpoint

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "The Eiffel tower is in Paris.", "Bananas are yellow.",
        "Berlin is the capital of Germany, and Paris that of France, as everyone knows."]


def _hf(path: str, cls_name: str):
    import transformers as tf

    return (getattr(tf, cls_name).from_pretrained(path).eval(),
            tf.AutoTokenizer.from_pretrained(path))


def test_cross_encoder_score_matches_transformers(minilm_dir, tmp_path):
    import torch

    from vllmx import LLM

    path = make_hf_checkpoint("bert_cls", str(tmp_path / "ce"), minilm_dir)
    model, tok = _hf(path, "BertForSequenceClassification")
    with torch.no_grad():
        enc = tok([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt")
        ref = torch.sigmoid(model(**enc).logits[:, 0]).numpy()
    llm = LLM(path)
    got = np.array([o.outputs.score for o in llm.score(QUERY, DOCS)])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    assert np.ptp(ref) > 1e-3  # the pairs' scores differ: token types and order matter
    # N:N pairs give the same scores as 1:N
    pairwise = llm.score([QUERY] * len(DOCS), DOCS)
    np.testing.assert_allclose([o.outputs.score for o in pairwise], got, rtol=1e-6)
    with pytest.raises(ValueError, match="1:N"):
        llm.score([QUERY, QUERY], DOCS)
    with pytest.raises(ValueError, match="embed"):
        llm.embed(QUERY)


def test_classifier_probs_match_transformers(minilm_dir, tmp_path):
    import torch

    from vllmx import LLM, PoolingParams

    path = make_hf_checkpoint("xlmr_cls", str(tmp_path / "cls"), minilm_dir)
    model, tok = _hf(path, "XLMRobertaForSequenceClassification")
    with torch.no_grad():
        logits = model(**tok(DOCS, padding=True, return_tensors="pt")).logits
    llm = LLM(path)
    outs = llm.classify(DOCS)
    probs = np.array([o.outputs.probs for o in outs])
    np.testing.assert_allclose(probs, torch.softmax(logits, -1).numpy(), rtol=1e-4, atol=1e-6)
    assert outs[0].outputs.num_classes == 3
    raw = llm.classify(DOCS, PoolingParams(use_activation=False))
    np.testing.assert_allclose([o.outputs.probs for o in raw], logits.numpy(), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(ValueError, match="score"):  # three labels: no single relevance score
        llm.score(QUERY, DOCS)


def test_embedding_model_scores_by_cosine(minilm_dir):
    from sentence_transformers import SentenceTransformer

    from vllmx import LLM

    st = SentenceTransformer(minilm_dir, device="cpu")
    e = st.encode([QUERY, *DOCS], convert_to_numpy=True).astype(np.float64)
    ref = e[1:] @ e[0] / np.linalg.norm(e[1:], axis=1) / np.linalg.norm(e[0])
    got = [o.outputs.score for o in LLM(minilm_dir).score(QUERY, DOCS)]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_decoder_converted_to_embedder(minilm_dir, tmp_path):
    """A Qwen3ForCausalLM checkpoint with convert='embed': the last token's final hidden state,
    normalized (Qwen3-Embedding's pooling), as transformers computes it."""
    import torch
    import transformers as tf

    from vllmx import LLM

    path = make_hf_checkpoint("qwen3", str(tmp_path / "q3"), minilm_dir,
                              architectures=["Qwen3ForCausalLM"])
    tf.Qwen3ForCausalLM.from_pretrained(path).save_pretrained(path)  # with its lm_head
    base = tf.AutoModel.from_pretrained(path).eval()
    tok = tf.AutoTokenizer.from_pretrained(path)
    refs = []
    with torch.no_grad():
        for d in DOCS:
            h = base(**tok(d, return_tensors="pt")).last_hidden_state[0, -1].numpy()
            refs.append(h / np.linalg.norm(h))
    llm = LLM(path, convert="embed")
    got = np.array([o.outputs.embedding for o in llm.embed(DOCS)])
    np.testing.assert_allclose(got, np.array(refs), atol=1e-5)
    with pytest.raises(ValueError, match="generative"):
        llm.generate("hello")


def test_matryoshka_dimensions(minilm_dir, tmp_path):
    from vllmx import LLM, PoolingParams

    path = make_st_checkpoint("bert", str(tmp_path / "m"), minilm_dir, is_matryoshka=True)
    llm = LLM(path)
    full = np.array([o.outputs.embedding for o in llm.embed(DOCS)])
    short = np.array([o.outputs.embedding for o in llm.embed(DOCS, PoolingParams(dimensions=16))])
    ref = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, ref, atol=1e-6)
    with pytest.raises(ValueError, match="dimensions"):
        llm.embed(DOCS, PoolingParams(dimensions=65))


def test_bad_input(minilm_dir):
    from vllmx import LLM, PoolingParams

    llm = LLM(minilm_dir)
    assert llm.pooling_engine.config.model_config.max_model_len == 256  # max_seq_length
    with pytest.raises(ValueError, match="empty"):
        llm.embed("")
    with pytest.raises(ValueError, match="maximum context length is 256"):
        llm.embed("word " * 300)
    # truncate_prompt_tokens keeps the last tokens instead
    out = llm.embed("word " * 300, truncate_prompt_tokens=32)
    assert len(out[0].prompt_token_ids) == 32
    with pytest.raises(ValueError, match="matryoshka"):
        llm.embed("hi", PoolingParams(dimensions=8))
    with pytest.raises(ValueError, match="use_activation is not a parameter"):
        llm.embed("hi", PoolingParams(use_activation=True))
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.embed({"prompt_token_ids": [101, 10**6]})
    with pytest.raises(ValueError, match="generative models"):
        llm.generate("hi")
    # No GPU pooling path yet; without a usable GPU the device itself is named first.
    with pytest.raises(ValueError, match="run on the CPU|device='cuda': (no CUDA GPU|this vllmx)"):
        LLM(minilm_dir, device="cuda")


def test_generate_model_refuses_pooling_calls(smollm2_gguf):
    from vllmx import LLM

    llm = LLM(smollm2_gguf, max_model_len=256, kv_cache_memory_bytes=32 << 20)
    with pytest.raises(ValueError, match="pooling models"):
        llm.embed("hi")


def test_decoder_sequence_classifier_matches_transformers(minilm_dir, tmp_path):
    """transformers' Qwen3ForSequenceClassification: score.weight over the last token."""
    import torch

    from vllmx import LLM

    path = make_hf_checkpoint("qwen3_cls", str(tmp_path / "q3cls"), minilm_dir)
    model, tok = _hf(path, "Qwen3ForSequenceClassification")
    with torch.no_grad():
        ref = np.array([torch.softmax(model(**tok(d, return_tensors="pt")).logits[0], -1)
                        .numpy() for d in DOCS])
    got = np.array([o.outputs.probs for o in LLM(path).classify(DOCS)])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


def test_qwen3_reranker_from_lm_head(minilm_dir, tmp_path):
    """Qwen3-Reranker as vLLM serves it: a Qwen3ForCausalLM checkpoint with hf_overrides
    naming the answer tokens; score = sigmoid(logit('yes') - logit('no')) at the pair's last
    token, from transformers' LM."""
    import torch
    import transformers as tf

    from vllmx import LLM

    path = make_hf_checkpoint("qwen3", str(tmp_path / "rr"), minilm_dir,
                              architectures=["Qwen3ForCausalLM"])
    lm = tf.Qwen3ForCausalLM.from_pretrained(path).eval()
    lm.save_pretrained(path)
    tok = tf.AutoTokenizer.from_pretrained(path)
    no, yes = tok.convert_tokens_to_ids(["no", "yes"])
    with torch.no_grad():
        ref = []
        for d in DOCS:
            logits = lm(**tok(QUERY, d, return_tensors="pt")).logits[0, -1]
            ref.append(float(torch.sigmoid(logits[yes] - logits[no])))
    llm = LLM(path, hf_overrides={"architectures": ["Qwen3ForSequenceClassification"],
                                  "classifier_from_token": ["no", "yes"],
                                  "is_original_qwen3_reranker": True})
    got = [o.outputs.score for o in llm.score(QUERY, DOCS)]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
