"""RotaryEmbedding(num_positions=...): the cache holds only the positions the engine can reach
(max_model_len), and those rows equal the full cache's for every rope flavour; a position past
them is an error, not a read past the buffer."""

import numpy as np
import pytest

from vllmx.layers.rotary import RotaryEmbedding

SCALINGS = [None, {"rope_type": "linear", "factor": 4.0},
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
            {"rope_type": "dynamic", "factor": 2.0},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: (s or {}).get("rope_type", "default"))
def test_cache_rows_are_the_first_of_the_full_cache(scaling):
    full = RotaryEmbedding(64, 64, 2048, 10000.0, True, scaling)
    short = RotaryEmbedding(64, 64, 2048, 10000.0, True, scaling, num_positions=300)
    assert short.cos_sin_cache.shape == (300, 64)
    assert np.array_equal(short.cos_sin_cache, full.cos_sin_cache[:300])


def test_dynamic_ntk_rows_past_the_trained_length():
    full = RotaryEmbedding(64, 64, 2048, 10000.0, True, SCALINGS[3])
    short = RotaryEmbedding(64, 64, 2048, 10000.0, True, SCALINGS[3], num_positions=3000)
    assert full.cos_sin_cache.shape == (4096, 64)
    assert np.array_equal(short.cos_sin_cache, full.cos_sin_cache[:3000])


def test_position_past_the_cache_raises():
    rope = RotaryEmbedding(16, 16, 2048, 10000.0, True, num_positions=8)
    q = np.zeros((1, 32), np.float32)
    k = np.zeros((1, 16), np.float32)
    rope(np.array([7], np.int32), q, k)
    with pytest.raises(ValueError, match="8"):
        rope(np.array([8], np.int32), q, k)
