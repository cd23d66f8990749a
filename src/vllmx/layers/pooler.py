"""vLLM's Pooler: one forward's token hidden states [T, H] -> each request's output. CLS /
MEAN / LAST pick or average a sequence's rows; embed then keeps a Matryoshka model's leading
`dimensions` and L2-normalizes; classify / score run the model's classifier head over the
pooled rows and its activation (softmax over the labels, sigmoid for a single label)."""

from __future__ import annotations

import numpy as np

from vllmx.pooling_params import PoolingParams


def _normalize(x: np.ndarray) -> np.ndarray:
    # float64 norms, as torch's F.normalize (eps 1e-12) on the f32 rows
    norm = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def _activation(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    if x.shape[-1] == 1:
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return (x / x.sum(axis=-1, keepdims=True)).astype(np.float32)


class Pooler:
    def __init__(self, pooling_type: str, classifier=None):
        self.pooling_type = pooling_type
        self.classifier = classifier  # pooled rows [B, H] -> logits [B, num_labels], or None

    def pool_rows(self, hidden: np.ndarray, query_start_loc: np.ndarray) -> np.ndarray:
        """[B, H]: each sequence's pooled row."""
        starts, ends = query_start_loc[:-1], query_start_loc[1:]
        if self.pooling_type == "CLS":
            return hidden[starts]
        if self.pooling_type == "LAST":
            return hidden[ends - 1]
        sums = np.add.reduceat(hidden.astype(np.float64), starts, axis=0)
        return (sums / (ends - starts)[:, None]).astype(np.float32)

    def __call__(self, hidden: np.ndarray, query_start_loc: np.ndarray,
                 params: list[PoolingParams]) -> list[np.ndarray]:
        hidden = np.asarray(hidden, dtype=np.float32)
        pooled = self.pool_rows(hidden, query_start_loc)
        logits = None
        if any(p.task in ("classify", "score") for p in params) and self.classifier is not None:
            logits = self.classifier(pooled)
        outs = []
        for b, p in enumerate(params):
            if p.task == "token_embed":
                x = hidden[query_start_loc[b]:query_start_loc[b + 1]]
            elif p.task in ("classify", "score") and logits is not None:
                x = logits[b]
                outs.append(_activation(x) if p.use_activation else x.copy())
                continue
            else:  # embed (and score by cosine on an embedding model)
                x = pooled[b]
            if p.dimensions is not None:
                x = x[..., :p.dimensions]
            outs.append(_normalize(x) if p.normalize else np.array(x, dtype=np.float32))
        return outs
