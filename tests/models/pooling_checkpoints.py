"""Tiny random pooling checkpoints written by transformers and wrapped by sentence-transformers
(modules.json, the Pooling config, Normalize), with the real MiniLM's BERT tokenizer."""

from __future__ import annotations

import os
import shutil

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
VOCAB = 30522  # the MiniLM tokenizer's
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 128}
# (transformers class, config class, sentence-transformers pooling mode or None, extra config)
KINDS = {
    "bert": ("BertModel", "BertConfig", "mean", {}),
    "bert_mlm": ("BertForMaskedLM", "BertConfig", "cls", {}),
    "xlmr": ("XLMRobertaModel", "XLMRobertaConfig", "cls", {"max_position_embeddings": 130}),
    "qwen3": ("Qwen3Model", "Qwen3Config", "lasttoken",
              {"num_key_value_heads": 2, "head_dim": 16}),
    "bert_cls": ("BertForSequenceClassification", "BertConfig", None, {"num_labels": 1}),
    "qwen3_cls": ("Qwen3ForSequenceClassification", "Qwen3Config", None,
                  {"num_key_value_heads": 2, "head_dim": 16, "num_labels": 2, "pad_token_id": 0}),
    "xlmr_cls": ("XLMRobertaForSequenceClassification", "XLMRobertaConfig", None,
                 {"num_labels": 3, "max_position_embeddings": 130}),
}


def make_hf_checkpoint(kind: str, out_dir: str, tokenizer_dir: str | None, seed: int = 0,
                       **extra) -> str:
    """The kind's transformers checkpoint, with the tokenizer of tokenizer_dir (None: none,
    for token-id prompts)."""
    import torch
    import transformers as tf

    model_cls, config_cls, _, kind_extra = KINDS[kind]
    torch.manual_seed(seed)
    # initializer_range 0.2: wide enough that the tiny model's outputs differ by input
    cfg = getattr(tf, config_cls)(**{**_COMMON, "initializer_range": 0.2, **kind_extra, **extra})
    model = getattr(tf, model_cls)(cfg).eval()
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    return out_dir


def make_st_checkpoint(kind: str, out_dir: str, tokenizer_dir: str, **extra) -> str:
    """A sentence-transformers checkpoint: Transformer + Pooling (the kind's mode) +
    Normalize, saved with SentenceTransformer.save."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6 moved the modules
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    hf_dir = make_hf_checkpoint(kind, out_dir + "-hf", tokenizer_dir, **extra)
    t = models.Transformer(hf_dir)
    pooling = models.Pooling(t.get_embedding_dimension(), pooling_mode=KINDS[kind][2])
    st = SentenceTransformer(modules=[t, pooling, models.Normalize()], device="cpu")
    st.save(out_dir)
    return out_dir
