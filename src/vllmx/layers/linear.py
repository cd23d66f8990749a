"""Linear layers over weights kept in their stored format (f32/f16/bf16 or GGUF blocks). On the
CPU block weights are repacked once, here, into the layout of the CPU kernels
(ops.repack_weight); on the GPU weights are uploaded as the placement says (layers.placement)."""

from __future__ import annotations

import weakref

import numpy as np

from vllmx import _C, ops
from vllmx.device import BF16, F16, F32, Q8_0, DeviceArray
from vllmx.distributed.parallel_state import get_tp_group, shard_range
from vllmx.layers import placement
from vllmx.ops import Weight
from vllmx.pages import release_file_pages

# Packed copies by id of the source array, so that Linears sharing a weight share one copy.
_packed: dict[int, Weight] = {}


def packed(weight: Weight, fp8: bool = False) -> Weight:
    """The weight as the current device's linear kernels read it: shared by every Linear
    built over the same source array (a tied embedding / lm_head is uploaded once). fp8: a
    projection online fp8 may quantize (placement.upload_weight)."""
    key = (id(weight.data), True) if fp8 else id(weight.data)  # (lookup_table reads the latter)
    hit = _packed.get(key)
    if hit is not None:
        return hit
    if placement.current().on_gpu:
        p = placement.upload_weight(weight, fp8=fp8)
    else:
        p = ops.repack_weight(weight)
        if p is weight:  # a dense weight: at least on a cache-line boundary
            p = ops.align_weight(weight)
    if p is not weight:
        _packed[key] = p
        weakref.finalize(weight.data, _packed.pop, key, None)
    return p


def take_rows(w: Weight, rows) -> Weight:
    """A copy of the rows of w (a matrix, or a bias vector) at the indices given, in w's own
    format (a block weight's rows are whole rows of blocks)."""
    rows = np.asarray(rows)
    return Weight(np.ascontiguousarray(np.asarray(w.data)[rows]), w.dtype,
                  (len(rows),) + tuple(w.shape[1:]))


def scale_rows(w: Weight, scale) -> Weight:
    """w with row r times scale[r] (or every row times one scale), as an f32 weight: a model's
    constant multipliers on a projection's input or output folded into its matrix."""
    rows = np.asarray(scale, dtype=np.float64).reshape(-1, *([1] * (len(w.shape) - 1)))
    return Weight.from_numpy((w.to_float32().reshape(w.shape) * rows).astype(np.float32))


class Linear:
    # Online fp8 (quantization="fp8") quantizes projections; the lm_head stays in its dtype.
    fp8 = True

    def __init__(self, weight: Weight, bias: Weight | None = None):
        self.weight = weight if isinstance(weight, DeviceArray) else packed(weight, self.fp8)
        self.bias = None if bias is None else placement.upload_vector(
            np.ascontiguousarray(bias.to_float32()).reshape(-1))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ops.linear(x, self.weight, self.bias)

    def norm_proj(self, x, residual, norm, act: str | None = None):
        """(self(norm(x + residual)), x + residual): ops.rms_norm_linear with this layer's
        weight; norm is an RMSNorm layer."""
        return ops.rms_norm_linear(x, residual, norm.weight, norm.eps, self.weight, self.bias,
                                   act)


class UnquantizedLinear(Linear):
    """A Linear that online fp8 leaves in its dtype, as vLLM builds such layers with
    quant_config=None: a mixture of experts' router."""

    fp8 = False


class LMHeadLinear(UnquantizedLinear):
    """A model's lm_head as a plain Linear (models without tensor-parallel heads): online fp8
    leaves it in its dtype, as vLLM does."""


class RowParallelLinear(Linear):
    """vLLM's RowParallelLinear: under tensor parallelism this rank holds the weight's columns
    for its share of the input (distributed/tp_shard.py cut them), and the ranks' partial
    products are summed (all_reduce); the bias is added by rank 0 alone, so once. Without a
    group, a Linear."""

    def __init__(self, weight: Weight, bias: Weight | None = None):
        self.tp_group = get_tp_group()
        super().__init__(weight, bias if self.tp_group is None or self.tp_group.rank == 0
                         else None)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = ops.linear(x, self.weight, self.bias)
        if self.tp_group is not None:
            self.tp_group.all_reduce(out)
        return out


class ParallelLMHead(Linear):
    """vLLM's ParallelLMHead: under tensor parallelism this rank holds ceil(V / tp) rows of the
    vocabulary (its share, shard_range: rows vocab_start on, the same rows a tied or
    vocabulary-parallel embedding holds) and every rank gets the whole [T, V] logits
    (all_gather). vocab_size: V (the weight's rows without a group)."""

    fp8 = False  # (online fp8 leaves the lm_head as it is, as vLLM does)

    def __init__(self, weight: Weight, vocab_size: int | None = None):
        super().__init__(weight)
        self.tp_group = g = get_tp_group()
        self.vocab_size = self.weight.shape[0] if g is None else int(vocab_size)
        self.vocab_start, self._part = 0, self.vocab_size  # (a rank's rows, all but the last's)
        if g is not None:
            self.vocab_start = shard_range(self.vocab_size, g.rank, g.world_size)[0]
            self._part = -(-self.vocab_size // g.world_size)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        logits = ops.linear(x, self.weight, self.bias)
        g = self.tp_group
        if g is None:
            return logits
        return g.all_gather(logits, self.vocab_size, self._part)


# Packed layouts the embedding op reads row by row (csrc/repack: unpack_row).
_ROW_READABLE = {d for d in (_C.packed_dtype(t, False) for t in (Q8_0, F32, F16, BF16)) if d >= 0}


def lookup_table(table):
    """The table embedding lookups read: a tied table's lm_head copy where the CPU packed one
    in a layout read by row, so that the mapped file's table (its pages released when the copy
    was made) is never paged in again (Gemma-3-270M's Q8_0 table: 170 MB); else table."""
    hit = _packed.get(id(table.data)) if isinstance(table, Weight) else None
    return hit if isinstance(hit, Weight) and hit.dtype in _ROW_READABLE else table


def vocab_parallel_embedding(input_ids, table, group=None, vocab_start: int = 0):
    """The tokens' embeddings (ops.embedding, a tied table read through lookup_table); under
    tensor parallelism (vLLM's VocabParallelEmbedding) table holds this rank's rows of the
    vocabulary from vocab_start: each rank looks its ids up there, zeros elsewhere, and the
    ranks' rows are summed."""
    if group is None:
        return ops.embedding(input_ids, lookup_table(table))
    return group.all_reduce(ops.embedding_shard(input_ids, table, vocab_start))


def concat_rows(weights: list[Weight]) -> Weight:
    """One weight from several with the same input size and dtype (e.g. gate and up), so one
    matmul serves them. Rows of blocks are independent, so this is exact for every dtype."""
    dtypes = {w.dtype for w in weights}
    ks = {w.shape[-1] for w in weights}
    if len(dtypes) != 1 or len(ks) != 1:
        raise ValueError(f"cannot fuse weights of dtypes {dtypes} and input sizes {ks}")
    data = np.concatenate([np.asarray(w.data) for w in weights], axis=0)
    for w in weights:  # only the copy is read from now on
        release_file_pages(w.data)
    return Weight(data, weights[0].dtype, (sum(w.shape[0] for w in weights), ks.pop()))


def qkv_by_group(w: Weight, b: Weight | None, num_kv_heads: int, q_per_kv: int,
                 head_dim: int) -> tuple[Weight, Weight | None]:
    """A fused query_key_value whose rows come in kv groups, each [its q_per_kv q heads; its k
    head; its v head], regrouped into [q heads; k heads; v heads], the layout the attention
    prologue reads (a permutation of whole rows: exact for every dtype). GPT-NeoX's per-head
    [q; k; v] is one group a head; Falcon's multi-query layout one group of all heads."""
    def regroup(a: np.ndarray) -> np.ndarray:
        rows = a.reshape(num_kv_heads, q_per_kv + 2, head_dim, -1)
        q = rows[:, :q_per_kv].reshape(-1, a.shape[-1])
        k, v = (rows[:, j].reshape(-1, a.shape[-1]) for j in (q_per_kv, q_per_kv + 1))
        return np.concatenate([q, k, v]).reshape(a.shape)

    data = regroup(np.asarray(w.data))
    release_file_pages(w.data)  # only the copy is read from now on
    bias = None if b is None else Weight.from_numpy(
        regroup(b.to_float32().reshape(-1, 1)).reshape(-1))
    return Weight(data, w.dtype, w.shape), bias


class MergedLinear:
    """Several projections of the same input as one matmul (vLLM's QKVParallelLinear /
    MergedColumnParallelLinear): the input is quantized once and the weights stream in one
    pass. Weights of different dtypes (e.g. a Q6_K v_proj beside Q4_K q/k in a Q4_K_M file)
    cannot share a matmul; they run separately and their outputs are concatenated."""

    def __init__(self, weights: list[Weight], biases: list[Weight | None]):
        self.output_sizes = [w.shape[0] for w in weights]
        bias = None
        if any(b is not None for b in biases):
            bias = Weight.from_numpy(np.concatenate([
                np.zeros(n, np.float32) if b is None else b.to_float32().reshape(-1)
                for n, b in zip(self.output_sizes, biases)]))
        if len({w.dtype for w in weights}) == 1:
            self.parts = [Linear(concat_rows(weights), bias)]
        else:
            self.parts = [Linear(w, b) for w, b in zip(weights, biases)]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if len(self.parts) == 1:
            return self.parts[0](x)
        return ops.concat_columns([p(x) for p in self.parts])

    def act_and_mul(self, x: np.ndarray, act: str = "silu") -> np.ndarray:
        """act(gate) * up of a [gate; up] projection (vLLM's gate_up_proj + SiluAndMul): one
        op over the merged weight, which on the GPU is one GEMV for decode rows."""
        if len(self.parts) == 1 and self.parts[0].bias is None:
            return ops.linear_act_and_mul(x, self.parts[0].weight, act)
        return ops.act_and_mul(self(x), act)

    def norm_proj(self, x, residual, norm, act: str | None = None):
        """norm(x, residual) then this projection (act: then act_and_mul), fused into one op
        when the projections share one matmul; returns (out, residual)."""
        if len(self.parts) == 1:
            return self.parts[0].norm_proj(x, residual, norm, act)
        h, residual = (norm(x), x) if residual is None else norm(x, residual)
        return (self(h) if act is None else self.act_and_mul(h, act)), residual
