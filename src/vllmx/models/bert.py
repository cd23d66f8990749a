"""The BERT family as pooling models (vLLM's bert.py / roberta.py): BertModel and XLMRobertaModel
embedders (a BertForMaskedLM-style checkpoint's bert.* tensors too), and the
BertForSequenceClassification / XLMRobertaForSequenceClassification cross-encoders.

Against the decoders: bidirectional attention (layers/encoder_attention.py), learned absolute
positions plus a token-type embedding (the second segment of a cross-encoder pair), and
post-norm layers: LayerNorm(x + attention(x)), then LayerNorm(x + MLP(x)), biases everywhere.
RoBERTa's positions start past its padding index (padding_idx + 1 + i)."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.encoder_attention import EncoderAttention, EncoderAttentionMetadata, PoolingBatch
from vllmx.layers.linear import Linear, MergedLinear
from vllmx.layers.mlp import GeluMLP
from vllmx.layers.norm import LayerNorm, ResidualAdd
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight

ROBERTA_ARCHS = ("XLMRobertaModel", "XLMRobertaForSequenceClassification", "RobertaModel",
                 "RobertaForSequenceClassification", "XLMRobertaForMaskedLM", "RobertaForMaskedLM")


class _Prefixed(dict):
    """A checkpoint's tensors under the bare BertModel names: 'bert.' / 'roberta.' dropped."""

    def __init__(self, weights, prefix: str):
        super().__init__((k.removeprefix(prefix), v) for k, v in weights.items())


def _base_prefix(weights) -> str:
    for prefix in ("bert.", "roberta.", "model."):
        if prefix + "embeddings.word_embeddings.weight" in weights:
            return prefix
    return ""


class BertLayer:
    def __init__(self, i: int, cfg: dict, w: dict[str, Weight]):
        p = f"encoder.layer.{i}."
        h, nh, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
        names = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
        self.qkv_proj = MergedLinear([w[n + ".weight"] for n in names],
                                     [w.get(n + ".bias") for n in names])
        self.hidden_size = h
        self.attn = EncoderAttention(nh, nh, h // nh, (h // nh) ** -0.5)
        self.o_proj = Linear(w[p + "attention.output.dense.weight"],
                             w.get(p + "attention.output.dense.bias"))
        self.attn_norm = LayerNorm(w[p + "attention.output.LayerNorm.weight"],
                                   w[p + "attention.output.LayerNorm.bias"], eps)
        self.mlp = GeluMLP(w[p + "intermediate.dense.weight"], w.get(p + "intermediate.dense.bias"),
                           w[p + "output.dense.weight"], w.get(p + "output.dense.bias"),
                           cfg["hidden_act"], "BERT")
        self.mlp_norm = LayerNorm(w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                                  eps)

    def __call__(self, h, md: EncoderAttentionMetadata):
        q, k, v = ops.split_columns(self.qkv_proj(h), [self.hidden_size] * 3)
        a = self.o_proj(self.attn(q, k, v, md))
        x, _ = self.attn_norm(a, h)  # post-norm: LN(h + attention(h)); h is spent
        m = self.mlp(x)
        out, _ = self.mlp_norm(m, x)
        return out


class ClassifierHead:
    """dense -> tanh -> out over the pooled (CLS) rows: BERT's pooler + classifier, RoBERTa's
    classifier.dense + classifier.out_proj. Runs on the B pooled rows only, on the host (the
    pooler brings them there)."""

    def __init__(self, dense: Weight, dense_bias: Weight, out: Weight, out_bias: Weight | None):
        self.dense = Linear(dense, dense_bias)
        self.out = Linear(out, out_bias)
        self.num_labels = out.shape[0]

    def __call__(self, pooled: np.ndarray) -> np.ndarray:
        return self.out(np.tanh(self.dense(np.ascontiguousarray(pooled, np.float32))))


class BertModel:
    """Token hidden states [T, H] of whole sequences; `classifier` for the cross-encoders."""

    is_pooling_model = True
    default_pooling_type = "CLS"  # vLLM's for BERT; a sentence-transformers config overrides it

    def __init__(self, cfg: dict, weights: dict[str, Weight]):
        cfg = dict(cfg)
        archs = cfg.get("architectures") or []
        cfg.setdefault("layer_norm_eps", 1e-12)
        cfg["hidden_act"] = cfg.get("hidden_act") or "gelu"
        if cfg["hidden_size"] % cfg["num_attention_heads"]:
            raise ValueError(f"BERT hidden_size {cfg['hidden_size']} is not a multiple of "
                             f"num_attention_heads {cfg['num_attention_heads']}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT position_embedding_type {cfg['position_embedding_type']!r} "
                             f"is not supported (only 'absolute')")
        roberta = any(a in ROBERTA_ARCHS for a in archs) or cfg.get("model_type") in (
            "roberta", "xlm-roberta")
        # RoBERTa numbers positions from padding_idx + 1 (create_position_ids_from_input_ids).
        self.position_offset = int(cfg.get("pad_token_id", 1)) + 1 if roberta else 0
        self.config = cfg
        w = _Prefixed(weights, _base_prefix(weights))
        self._check_weights(w)
        e = "embeddings."
        self.word_embeddings = placement.upload_weight(w[e + "word_embeddings.weight"],
                                                       e + "word_embeddings.weight")
        self.position_embeddings = placement.upload_weight(w[e + "position_embeddings.weight"],
                                                           e + "position_embeddings.weight")
        tt = w.get(e + "token_type_embeddings.weight")
        self.token_type_embeddings = None if tt is None else placement.upload_weight(
            tt, e + "token_type_embeddings.weight")
        self.emb_norm = LayerNorm(w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"],
                                  cfg["layer_norm_eps"])
        self._add = ResidualAdd(cfg["hidden_size"])
        self.layers = [BertLayer(i, cfg, w) for i in range(cfg["num_hidden_layers"])]
        self.max_positions = cfg["max_position_embeddings"] - self.position_offset
        with placement.placement(placement.Placement()):  # on the host: it reads pooled rows
            self.classifier = self._classifier(w, archs)
        self.vocab_size = cfg["vocab_size"]

    @staticmethod
    def _classifier(w, archs) -> ClassifierHead | None:
        if not any(a.endswith("ForSequenceClassification") for a in archs):
            return None
        if "classifier.out_proj.weight" in w:  # RoBERTa's head
            return ClassifierHead(w["classifier.dense.weight"], w["classifier.dense.bias"],
                                  w["classifier.out_proj.weight"], w.get("classifier.out_proj.bias"))
        require_tensors(w, ["pooler.dense.weight", "pooler.dense.bias", "classifier.weight"])
        return ClassifierHead(w["pooler.dense.weight"], w["pooler.dense.bias"],
                              w["classifier.weight"], w.get("classifier.bias"))

    def _check_weights(self, w) -> None:
        needed = [f"embeddings.{n}" for n in ("word_embeddings.weight",
                                              "position_embeddings.weight", "LayerNorm.weight",
                                              "LayerNorm.bias")]
        for i in range(self.config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            needed += [p + f"attention.self.{n}.weight" for n in ("query", "key", "value")]
            needed += [p + n for n in ("attention.output.dense.weight",
                                       "attention.output.LayerNorm.weight",
                                       "attention.output.LayerNorm.bias",
                                       "intermediate.dense.weight", "output.dense.weight",
                                       "output.LayerNorm.weight", "output.LayerNorm.bias")]
        require_tensors(w, needed)

    def forward(self, input_ids: np.ndarray, batch: PoolingBatch,
                token_type_ids: np.ndarray | None = None) -> np.ndarray:
        cfg, dev = self.config, batch.to_device
        h = ops.embedding(dev(input_ids), self.word_embeddings)
        pos = ops.embedding(dev(batch.positions + np.int32(self.position_offset)),
                            self.position_embeddings)
        if self.token_type_embeddings is not None:
            types = self.token_type_embeddings.shape[0]
            # RoBERTa has one type: its tokenizers give every token type 0, pairs included
            if token_type_ids is None or types == 1:
                token_type_ids = np.zeros(len(input_ids), np.int32)
            elif token_type_ids.max() >= types or token_type_ids.min() < 0:
                raise ValueError(f"token type ids must be in [0, {types}) (type_vocab_size), "
                                 f"got {int(token_type_ids.max())}")
            self._add(ops.embedding(dev(token_type_ids), self.token_type_embeddings), pos)
        h, _ = self.emb_norm(h, pos)
        nh = cfg["num_attention_heads"]
        md = EncoderAttentionMetadata(batch, nh, cfg["hidden_size"] // nh)
        for layer in self.layers:
            h = layer(h, md)
        return h

    @staticmethod
    def checkpoint_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
        """The tensors of a BertModel checkpoint of this config (load_format="dummy")."""
        h, inter = cfg["hidden_size"], cfg["intermediate_size"]
        shapes = {"embeddings.word_embeddings.weight": (cfg["vocab_size"], h),
                  "embeddings.position_embeddings.weight": (cfg["max_position_embeddings"], h),
                  "embeddings.token_type_embeddings.weight": (cfg.get("type_vocab_size", 2), h),
                  "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,)}
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            for name, out, k in (("attention.self.query", h, h), ("attention.self.key", h, h),
                                 ("attention.self.value", h, h), ("attention.output.dense", h, h),
                                 ("intermediate.dense", inter, h), ("output.dense", h, inter)):
                shapes[p + name + ".weight"], shapes[p + name + ".bias"] = (out, k), (out,)
            for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
                shapes[p + norm + ".weight"] = shapes[p + norm + ".bias"] = (h,)
        return shapes
