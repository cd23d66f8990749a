"""YaRN rope scaling: the cos/sin cache equals transformers' (its inverse frequencies and
attention factor, cos/sin scaled by it) for the attention factor given, derived from the
factor, and from DeepSeek's mscale / mscale_all_dim, with and without truncation."""

import numpy as np
import pytest

from vllmx.layers.rotary import RotaryEmbedding

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HEAD_DIM, MAX_POS, THETA = 64, 4096, 10000.0
VARIANTS = {
    "derived": {"factor": 4.0},
    "given": {"factor": 4.0, "attention_factor": 1.2079},
    "mscale": {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707},
    "no_truncate": {"factor": 4.0, "beta_fast": 16, "beta_slow": 2, "truncate": False},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_yarn_cache_equals_transformers(variant):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "yarn", "rope_theta": THETA, "original_max_position_embeddings": 1024,
              **VARIANTS[variant]}
    cfg = transformers.LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4,
                                   max_position_embeddings=MAX_POS, rope_parameters=params)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    freqs = np.outer(np.arange(MAX_POS, dtype=np.float64), inv_freq.double().numpy())
    ref = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1) * attention_factor

    mine = RotaryEmbedding(HEAD_DIM, HEAD_DIM, MAX_POS, THETA, True, params).cos_sin_cache
    # transformers computes the frequencies in f32; the cache is f32 either way.
    assert np.abs(mine - ref).max() < 2e-4
    assert attention_factor != 1.0
    unscaled = RotaryEmbedding(HEAD_DIM, HEAD_DIM, MAX_POS, THETA, True).cos_sin_cache
    assert np.abs(mine - unscaled).max() > 0.1  # the scaling moves it


def test_longrope_short_then_long_factors_equal_transformers():
    """Phi-3's longrope: positions below original_max_position_embeddings take transformers'
    short-factor frequencies, the rest its long-factor ones; cos and sin scaled by its
    attention factor. Rows from MAX_POS on hold the long factors at every position (a prompt
    longer than the original context), at the offset the rope reports."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    dim, orig = 32, 512
    rng = np.random.default_rng(0)
    params = {"rope_type": "longrope", "rope_theta": THETA, "original_max_position_embeddings": orig,
              "short_factor": (1 + rng.random(dim // 2)).tolist(),
              "long_factor": (1 + 8 * rng.random(dim // 2)).tolist()}
    cfg = transformers.Phi3Config(hidden_size=dim * 4, num_attention_heads=4, pad_token_id=0,
                                  max_position_embeddings=MAX_POS, rope_parameters=params,
                                  original_max_position_embeddings=orig)
    init = ROPE_INIT_FUNCTIONS["longrope"]
    (short, attn), (long, _) = init(cfg, "cpu", seq_len=orig), init(cfg, "cpu", seq_len=orig + 1)
    pos = np.arange(MAX_POS, dtype=np.float64)[:, None]
    freqs = np.where(pos < orig, pos * short.double().numpy(), pos * long.double().numpy())
    ref = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1) * attn

    rope = RotaryEmbedding(dim, dim, MAX_POS, THETA, True, params)
    mine = rope.cos_sin_cache
    assert rope.long_prompt_offset == (orig, MAX_POS) and mine.shape[0] == 2 * MAX_POS
    assert attn > 1.0 and np.abs(mine[:MAX_POS] - ref).max() < 2e-4
    freqs = pos * long.double().numpy()
    ref_long = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1) * attn
    assert np.abs(mine[MAX_POS:] - ref_long).max() < 2e-4
