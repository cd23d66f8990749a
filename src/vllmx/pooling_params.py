"""vLLM's PoolingParams: what a request to a pooling model asks of its pooled output."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

# vLLM's pooling tasks: one vector per prompt (embed), class probabilities (classify), a pair's
# relevance (score), or one vector per token (token_embed).
PoolingTask = Literal["embed", "classify", "score", "token_embed"]
POOLING_TASKS = ("embed", "classify", "score", "token_embed")

# The fields each task reads (vLLM's valid_parameters); a request setting another is refused.
_VALID = {"embed": ("dimensions", "normalize"), "token_embed": ("dimensions", "normalize"),
          "classify": ("use_activation",), "score": ("use_activation",)}


@dataclass
class PoolingParams:
    """truncate_prompt_tokens: keep the last k tokens (-1: max_model_len); dimensions: a
    Matryoshka model's leading dimensions (then normalized again); normalize: L2-normalize
    embeddings (None: the model's default); use_activation: softmax / sigmoid over classifier
    logits (None: on)."""

    truncate_prompt_tokens: int | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None
    task: PoolingTask | None = None

    def clone(self) -> PoolingParams:
        return replace(self)

    def verify(self, task: PoolingTask, hidden_size: int, max_model_len: int,
               is_matryoshka: bool = False, matryoshka_dimensions: list[int] | None = None
               ) -> PoolingParams:
        """A copy for `task` with the defaults filled; ValueError naming the bad field."""
        if task not in POOLING_TASKS:
            raise ValueError(f"pooling task {task!r} is not one of {', '.join(POOLING_TASKS)}")
        if self.task is not None and self.task != task:
            raise ValueError(f"PoolingParams.task is {self.task!r} but the request is for "
                             f"{task!r}")
        for name in ("dimensions", "normalize", "use_activation"):
            if getattr(self, name) is not None and name not in _VALID[task]:
                raise ValueError(f"{name} is not a parameter of the {task!r} task "
                                 f"(it takes {', '.join(_VALID[task])})")
        t = self.truncate_prompt_tokens
        if t is not None and (t == 0 or t < -1 or t > max_model_len):
            raise ValueError(f"truncate_prompt_tokens must be -1 or in [1, max_model_len="
                             f"{max_model_len}], got {t}")
        out = replace(self, task=task)
        if self.dimensions is not None:
            if not is_matryoshka:
                raise ValueError(f"Model does not support matryoshka representation, changing "
                                 f"output dimensions (dimensions={self.dimensions}) will lead to "
                                 f"poor results.")
            if matryoshka_dimensions and self.dimensions not in matryoshka_dimensions:
                raise ValueError(f"Model only supports {matryoshka_dimensions} matryoshka "
                                 f"dimensions, use other output dimensions will lead to poor "
                                 f"results (dimensions={self.dimensions}).")
            if not 1 <= self.dimensions <= hidden_size:
                raise ValueError(f"dimensions must be in [1, {hidden_size}] (the model's "
                                 f"hidden size), got {self.dimensions}")
        if task in ("embed", "token_embed") and out.normalize is None:
            out.normalize = True
        if task in ("classify", "score") and out.use_activation is None:
            out.use_activation = True
        return out
