"""The MLP without a gate: fc, gelu, proj, each projection with its bias where the checkpoint has
one (GPT-2's and Starcoder2's c_fc / c_proj, GPT-NeoX's dense_h_to_4h / dense_4h_to_h). The
gated MLPs (SwiGLU, GeGLU) are a MergedLinear's act_and_mul."""

from __future__ import annotations

from vllmx import ops
from vllmx.layers.linear import Linear, RowParallelLinear
from vllmx.ops import Weight

# HF hidden_act names -> ops.gelu's approximate: erf, or the tanh form (gelu_new and gelu_fast
# are PyTorch's approximate="tanh" written out).
GELU_APPROXIMATE = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh",
                    "gelu_fast": "tanh"}


class GeluMLP:
    def __init__(self, fc: Weight, fc_bias: Weight | None, proj: Weight, proj_bias: Weight | None,
                 hidden_act: str, family: str):
        if hidden_act not in GELU_APPROXIMATE:
            raise ValueError(f"{family} with hidden_act {hidden_act!r} is not supported "
                             f"(supported: {', '.join(sorted(GELU_APPROXIMATE))})")
        self.approximate = GELU_APPROXIMATE[hidden_act]
        self.fc = Linear(fc, fc_bias)
        self.proj = RowParallelLinear(proj, proj_bias)  # (a Linear without tensor parallelism)

    def __call__(self, x):
        return self.proj(ops.gelu(self.fc(x), self.approximate))
