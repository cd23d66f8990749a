"""The multi-token-prediction layers of DeepSeek-V3 and GLM-4.5 (vLLM's DeepSeekMTP /
Glm4MoeMTP, the same math), and of Qwen3-Next / Qwen3.5 (Qwen3NextMTP, below), the drafters of
speculative method mtp (spec_decode/mtp_proposer.py).
The checkpoint stores it after the last decoder layer, as model.layers.{num_hidden_layers}.*:
enorm, hnorm, eh_proj, a decoder layer of the target's kind (the target's mtp_block builds it:
DeepSeek's MLA, GLM's attention; MoE past first_k_dense_replace), shared_head.norm and, in some
checkpoints, its own copies of the embeddings and the output head (else the target's are used).

At position p it reads the target's hidden state there (the final-normed one lm_head reads, as
vLLM feeds it) and the embedding of token p + 1, and its logits propose token p + 2:
    x = eh_proj([enorm(embed(token p + 1)); hnorm(hidden p)])
    out = decoder_layer(x) (its residual stream: x + attention + MLP)
    logits = head(shared_head.norm(out))
Its decoder layer attends over a KV cache of its own (layer index num_hidden_layers in the
caches). A further draft chains on `out` in place of the target's hidden state. As in vLLM, the
embedding at position 0 is zeroed."""

from __future__ import annotations

import numpy as np

from vllmx import ops
from vllmx.layers import placement
from vllmx.layers.attention import AttentionMetadata
from vllmx.layers.linear import Linear, vocab_parallel_embedding
from vllmx.layers.norm import ResidualAdd, RMSNorm
from vllmx.models.draft_head import DraftHead
from vllmx.models.shapes import require_tensors
from vllmx.ops import Weight


class MultiTokenPredictorLayer(DraftHead):
    def __init__(self, target, weights: dict[str, Weight]):
        """target: the loaded model (DeepseekV2ForCausalLM, LlamaForCausalLM for GLM-4.5),
        whose mtp_block(weights, i) is its decoder layer i built from the checkpoint."""
        cfg = target.config
        n = cfg["num_hidden_layers"]
        self.layer_idx = n  # its KV cache's index among the layers' caches
        p = f"model.layers.{n}."
        require_tensors(weights, [p + t + ".weight" for t in (
            "enorm", "hnorm", "eh_proj", "shared_head.norm", "input_layernorm")])
        eps = cfg["rms_norm_eps"]
        self.enorm = RMSNorm(weights[p + "enorm.weight"], eps)
        self.hnorm = RMSNorm(weights[p + "hnorm.weight"], eps)
        self.eh_proj = Linear(weights[p + "eh_proj.weight"])
        self.mtp_block = target.mtp_block(weights, n)
        self.shared_head_norm = RMSNorm(weights[p + "shared_head.norm.weight"], eps)
        embed = weights.get(p + "embed_tokens.weight")
        self.embed_tokens = (target.embed_tokens if embed is None
                             else placement.upload_weight(embed, p + "embed_tokens.weight"))
        head = weights.get(p + "shared_head.head.weight")
        self.head = target.lm_head if head is None else Linear(head)
        self.vocab_size = self.head.weight.shape[0]
        self._add = ResidualAdd(cfg["hidden_size"])

    def forward(self, input_ids: np.ndarray, positions: np.ndarray, hidden: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        """Rows of the layer's output (before shared_head.norm) for the tokens after each
        position (input_ids) and the hidden state at it (the target's, or a draft's own)."""
        e = vocab_parallel_embedding(input_ids, self.embed_tokens)
        # A sequence's first token has no embedding here (position 0: nothing before it).
        ops.zero_rows_at_position_(e, positions, 0)
        x = self.eh_proj(ops.concat_columns([self.enorm(e), self.hnorm(hidden)]))
        h, residual = self.mtp_block(positions, x, None, md)
        self._add(h, residual)
        return residual

    def compute_logits(self, out: np.ndarray) -> np.ndarray:
        return self.head(self.shared_head_norm(out))


class Qwen3NextMTP(DraftHead):
    """Qwen3-Next's and Qwen3.5's MTP layer (vLLM's Qwen3NextMTP), stored as mtp.*: at position p
        x = fc([pre_fc_norm_embedding(embed(token p + 1)); pre_fc_norm_hidden(hidden p)])
        out = norm(decoder_layer(x))    (its residual stream: x + attention + MLP)
        logits = lm_head(out)
    with the (1 + w) RMSNorms of the model, a gated full-attention decoder layer (MoE or dense
    MLP, as mtp.layers.0 has it) over a KV cache of its own (layer index num_hidden_layers),
    the target's embeddings and head. A further draft chains on out; nothing is zeroed at
    position 0."""

    def __init__(self, target, weights: dict[str, Weight]):
        from vllmx.models.qwen3_next import offset_norm

        cfg = target.config
        n = cfg["num_hidden_layers"]
        self.layer_idx = n
        names = ("fc", "norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden",
                 "layers.0.input_layernorm")
        require_tensors(weights, [f"mtp.{t}.weight" for t in names])
        eps = cfg["rms_norm_eps"]
        self.pre_fc_norm_embedding = offset_norm(weights["mtp.pre_fc_norm_embedding.weight"], eps)
        self.pre_fc_norm_hidden = offset_norm(weights["mtp.pre_fc_norm_hidden.weight"], eps)
        self.fc = Linear(weights["mtp.fc.weight"])
        self.mtp_block = target.mtp_block(weights, n)
        self.norm = offset_norm(weights["mtp.norm.weight"], eps)
        self.embed_tokens, self.head = target.embed_tokens, target.lm_head
        self.vocab_size = target.vocab_size

    def forward(self, input_ids: np.ndarray, positions: np.ndarray, hidden: np.ndarray,
                md: AttentionMetadata) -> np.ndarray:
        e = vocab_parallel_embedding(input_ids, self.embed_tokens)
        x = self.fc(ops.concat_columns([self.pre_fc_norm_embedding(e),
                                        self.pre_fc_norm_hidden(hidden)]))
        h, residual = self.mtp_block(positions, x, None, md)
        out, _ = self.norm(h, residual)
        return out

    def compute_logits(self, out: np.ndarray) -> np.ndarray:
        return self.head(out)
