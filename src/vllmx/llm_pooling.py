"""LLM's pooling methods (vLLM's LLM.embed / classify / score / encode), over a PoolingEngine."""

from __future__ import annotations

from collections.abc import Sequence

from vllmx.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from vllmx.pooling_params import POOLING_TASKS, PoolingParams


def _prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                            and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


def _params_list(pooling_params, n: int, truncate_prompt_tokens: int | None
                 ) -> list[PoolingParams]:
    if pooling_params is None:
        pooling_params = PoolingParams()
    if isinstance(pooling_params, Sequence):
        if len(pooling_params) != n:
            raise ValueError("the lengths of prompts and pooling_params must be the same")
        params = [p.clone() for p in pooling_params]
    else:
        params = [pooling_params.clone() for _ in range(n)]
    if truncate_prompt_tokens is not None:
        for p in params:
            p.truncate_prompt_tokens = truncate_prompt_tokens
    return params


class PoolingMixin:
    """Needs self.pooling_engine (None for a generative model)."""

    pooling_engine = None

    def _pooling(self, api: str):
        return require_runner(self.pooling_engine, api, "pooling")

    def encode(self, prompts, pooling_params=None, *, pooling_task: str | None = None,
               truncate_prompt_tokens: int | None = None,
               use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """Raw pooled outputs (PoolingOutput.data, numpy) for pooling_task."""
        engine = self._pooling("encode")
        if pooling_task is None:
            raise ValueError(f"LLM.encode needs pooling_task (one of {', '.join(POOLING_TASKS)}"
                             f"; this model supports {', '.join(engine.supported_tasks)})")
        prompts = _prompt_list(prompts)
        return engine.encode(prompts, _params_list(pooling_params, len(prompts),
                                                   truncate_prompt_tokens), pooling_task)

    def embed(self, prompts, pooling_params=None, *, truncate_prompt_tokens: int | None = None,
              use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        outs = self.encode(prompts, pooling_params, pooling_task="embed",
                           truncate_prompt_tokens=truncate_prompt_tokens)
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def classify(self, prompts, pooling_params=None, *,
                 truncate_prompt_tokens: int | None = None,
                 use_tqdm: bool = True) -> list[ClassificationRequestOutput]:
        outs = self.encode(prompts, pooling_params, pooling_task="classify",
                           truncate_prompt_tokens=truncate_prompt_tokens)
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def score(self, data_1, data_2, /, *, truncate_prompt_tokens: int | None = None,
              use_tqdm: bool = True, pooling_params: PoolingParams | None = None
              ) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score: one text against many (1:N) or pairwise (N:N, equal lengths); a
        cross-encoder scores each pair as one input, an embedding model by cosine."""
        engine = self._pooling("score")
        pairs = score_pairs(data_1, data_2)
        params = (pooling_params or PoolingParams()).clone()
        if truncate_prompt_tokens is not None:
            params.truncate_prompt_tokens = truncate_prompt_tokens
        return [ScoringRequestOutput.from_base(o) for o in engine.score_pairs(pairs, params)]


def require_runner(engine, api: str, runner: str):
    """engine, or vLLM's ValueError for an LLM method the model's runner does not have."""
    if engine is None:
        kind = "pooling" if runner == "pooling" else "generative"
        raise ValueError(f"LLM.{api}() is only supported for {kind} models. Try passing "
                         f"`runner='{runner}'` (`--runner {runner}`) to use the model as a "
                         f"{kind} model.")
    return engine


def score_pairs(data_1, data_2) -> list[tuple]:
    """The (text_1, text_2) pairs of a score call: 1:N or N:N (vLLM's rule)."""
    one_1 = isinstance(data_1, (str, dict)) or (isinstance(data_1, list) and data_1
                                                 and isinstance(data_1[0], int))
    list_1 = [data_1] if one_1 else list(data_1)
    one_2 = isinstance(data_2, (str, dict)) or (isinstance(data_2, list) and data_2
                                                 and isinstance(data_2[0], int))
    list_2 = [data_2] if one_2 else list(data_2)
    if not list_1 or not list_2:
        raise ValueError("score needs at least one input on each side")
    if len(list_1) == 1:
        list_1 = list_1 * len(list_2)
    elif len(list_1) != len(list_2):
        raise ValueError(f"score takes one input against many (1:N) or equal numbers (N:N); "
                         f"got {len(list_1)} and {len(list_2)}")
    return list(zip(list_1, list_2))
