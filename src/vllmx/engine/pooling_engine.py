"""The engine of a pooling model (vLLM's pooling runner): prompts are tokenized and checked
here, run through PoolingModelRunner in forwards of whole prompts, and come back as
PoolingRequestOutputs. Nothing persists between calls, so there is no scheduler: a call is one
batch, and calls from several threads (the server's) take turns."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from vllmx import _C
from vllmx.config import VllmxConfig, json_dict
from vllmx.device import F32
from vllmx.layers.placement import Placement, placement
from vllmx.layers.pooler import Pooler
from vllmx.loader import load_model
from vllmx.outputs import PoolingOutput, PoolingRequestOutput
from vllmx.pages import keep_activations_in_heap
from vllmx.pooler_config import (
    PoolerConfig,
    load_pooler_config,
    sentence_transformers_max_seq_length,
)
from vllmx.pooling_params import PoolingParams, PoolingTask
from vllmx.worker.cuda_worker import model_activation_dtype, resolve_device
from vllmx.worker.pooling_runner import PoolingModelRunner

logger = logging.getLogger("vllmx")


class PoolingEngine:
    def __init__(self, config: VllmxConfig, pooler_config: dict | str | None = None):
        self.config = config
        mc, sc = config.model_config, config.scheduler_config
        if config.lora_config is not None:
            raise ValueError("LoRA adapters are not supported for pooling models yet "
                             "(enable_lora=True was given)")
        if config.parallel_config.world_size > 1:
            raise ValueError("tensor_parallel_size * pipeline_parallel_size > 1 is not "
                             "supported for pooling models yet")
        self.device = resolve_device(config.device_config.device)
        if config.parallel_config.num_threads:
            _C.set_num_threads(config.parallel_config.num_threads)
        t0 = time.perf_counter()
        asked_len = mc.max_model_len
        # On the GPU in the activation dtype vLLM's dtype="auto" picks (bf16 for an f32
        # checkpoint such as MiniLM; dtype="float32" runs the exact f32 kernels).
        act_dtype = F32
        if self.device == "cuda":
            act_dtype = model_activation_dtype(mc)
        with placement(Placement(self.device, act_dtype)):
            self.model, self.tokenizer = load_model(mc)
        if self.device != "cuda":
            keep_activations_in_heap()
        if self.tokenizer is not None:  # lengths are checked here, never silently cut
            self.tokenizer.backend_tokenizer.no_truncation()
            self.tokenizer.backend_tokenizer.no_padding()
        self._finish_max_model_len(asked_len)
        sc.max_model_len = mc.max_model_len
        mc.vocab_size = self.model.vocab_size
        self.pooler_config = self._pooler_config(pooler_config)
        self.classifier = getattr(self.model, "classifier", None)
        pooler = Pooler(self.pooler_config.pooling_type, self.classifier)
        self.runner = PoolingModelRunner(self.model, pooler, sc.max_num_batched_tokens,
                                         sc.max_num_seqs, self.device, act_dtype)
        hf = mc.hf_config
        self.hidden_size = int(hf["hidden_size"])
        self.is_matryoshka = bool(hf.get("is_matryoshka") or hf.get("matryoshka_dimensions"))
        self.matryoshka_dimensions = hf.get("matryoshka_dimensions")
        self._lock = threading.Lock()
        self._request_ids = itertools.count()
        logger.info("loaded %s as a pooling model (%s, %s pooling) on the %s in %.2fs", mc.path,
                    mc.convert_type, self.pooler_config.pooling_type,
                    "GPU" if self.device == "cuda" else "CPU", time.perf_counter() - t0)

    def _finish_max_model_len(self, asked: int | None) -> None:
        """vLLM's rule: the model's positions, capped by sentence-transformers' max_seq_length
        unless max_model_len was given."""
        mc = self.config.model_config
        limit = int(self.model.max_positions)
        if asked is None:
            st = sentence_transformers_max_seq_length(mc.path) if not mc.is_gguf else None
            mc.max_model_len = min(limit, int(st)) if st else limit
        elif asked > limit:
            raise ValueError(f"max_model_len={asked} is greater than the model's positions "
                             f"({limit})")

    def _pooler_config(self, override: dict | str | None) -> PoolerConfig:
        mc = self.config.model_config
        cfg = (load_pooler_config(mc.path) if not mc.is_gguf else None) or PoolerConfig()
        override = {} if override is None else json_dict(override, "pooler_config")
        for key, value in override.items():
            if key not in ("pooling_type", "normalize"):
                raise ValueError(f"pooler_config key {key!r} is not supported (pooling_type, "
                                 f"normalize)")
            setattr(cfg, key, value)
        cfg.__post_init__()
        if cfg.pooling_type is None:
            cfg.pooling_type = self.model.default_pooling_type
        return cfg

    # -- what the model can do ----------------------------------------------------------------
    @property
    def supported_tasks(self) -> tuple[str, ...]:
        if self.classifier is not None:
            return ("classify", "score") if self.classifier.num_labels == 1 else ("classify",)
        return ("embed", "token_embed", "score")

    def check_task(self, task: PoolingTask) -> None:
        if task not in self.supported_tasks:
            raise ValueError(f"the model does not support the {task!r} task (it supports: "
                             f"{', '.join(self.supported_tasks)})")

    # -- inputs -------------------------------------------------------------------------------
    def tokenize(self, prompt, truncate_prompt_tokens: int | None = None
                 ) -> tuple[list[int], list[int] | None]:
        """(token ids, token type ids or None) of a text, a token id list, a dict with
        'prompt' or 'prompt_token_ids', or a (text, text) pair; checked against max_model_len."""
        types = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, tuple):
            enc = self._tok().backend_tokenizer.encode(*prompt)
            ids, types = list(enc.ids), list(enc.type_ids)
        elif isinstance(prompt, str):
            if not prompt:  # (its special tokens alone would embed to a constant vector)
                raise ValueError("the input is empty: a pooling prompt needs some text")
            ids = self._tok().encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = prompt
            bad = [t for t in ids if not 0 <= t < self.model.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} is out of vocabulary (0..."
                                 f"{self.model.vocab_size - 1})")
        else:
            raise ValueError(f"a prompt must be a str, a list of token ids or a dict, got "
                             f"{type(prompt).__name__}")
        if not ids:
            raise ValueError("the input is empty: a pooling prompt needs at least one token")
        max_len = self.config.model_config.max_model_len
        if truncate_prompt_tokens is not None:
            k = max_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
            ids = ids[-k:]
            types = None if types is None else types[-k:]
        if len(ids) > max_len:
            raise ValueError(f"This model's maximum context length is {max_len} tokens. "
                             f"However, you requested {len(ids)} tokens in the input for "
                             f"embedding generation. Please reduce the length of the input.")
        return ids, types

    def _tok(self):
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; with skip_tokenizer_init=True pass "
                             "token ids")
        return self.tokenizer

    def verify(self, params: PoolingParams | None, task: PoolingTask) -> PoolingParams:
        self.check_task(task)
        params = params or PoolingParams()
        out = params.verify(task, self.hidden_size, self.config.model_config.max_model_len,
                            self.is_matryoshka, self.matryoshka_dimensions)
        if task in ("embed", "token_embed") and params.normalize is None:
            out.normalize = self.pooler_config.normalize
        return out

    # -- running --------------------------------------------------------------------------------
    def prepare(self, prompts: list, params: list[PoolingParams], task: PoolingTask
                ) -> list[PoolingInput]:
        """Every prompt tokenized and checked, every PoolingParams verified for `task`: one
        bad prompt fails the call (ValueError naming it) before anything runs."""
        if len(params) != len(prompts):
            raise ValueError("the lengths of prompts and pooling_params must be the same")
        if task == "score" and self.classifier is None:
            raise ValueError("score on an embedding model is the cosine of two embeddings: use "
                             "prepare_score")
        out = []
        for prompt, p in zip(prompts, params):
            p = self.verify(p, task)
            ids, types = self.tokenize(prompt, p.truncate_prompt_tokens)
            out.append(PoolingInput(ids, types, p))
        return out

    def execute(self, inputs: list[PoolingInput]) -> list[np.ndarray]:
        """The pooled output of each input, in order (forwards take turns across threads)."""
        with self._lock:
            return self.runner.execute([i.token_ids for i in inputs],
                                       [i.token_type_ids for i in inputs],
                                       [i.params for i in inputs])

    def outputs(self, inputs: list[PoolingInput], data: list[np.ndarray],
                request_ids: list[str] | None = None) -> list[PoolingRequestOutput]:
        if request_ids is None:  # (itertools.count: atomic, never waits for a forward)
            request_ids = [str(next(self._request_ids)) for _ in inputs]
        return [PoolingRequestOutput(rid, PoolingOutput(d), i.token_ids)
                for rid, d, i in zip(request_ids, data, inputs)]

    def encode(self, prompts: list, params: list[PoolingParams], task: PoolingTask,
               request_ids: list[str] | None = None) -> list[PoolingRequestOutput]:
        """One PoolingRequestOutput per prompt, in order."""
        inputs = self.prepare(prompts, params, task)
        return self.outputs(inputs, self.execute(inputs), request_ids)

    # -- scoring ----------------------------------------------------------------------------------
    def prepare_score(self, pairs: list[tuple], params: PoolingParams | None = None
                      ) -> list[PoolingInput]:
        """vLLM's scoring of (text_1, text_2) pairs: a cross-encoder reads each pair as one
        input; an embedding model embeds the text_1s, then the text_2s (score_outputs takes
        their cosines)."""
        if not pairs:
            raise ValueError("score needs at least one pair")
        if self.classifier is not None:
            self.check_task("score")
            items = [(a, b) if isinstance(a, str) and isinstance(b, str)
                     else _concat_ids(self, a, b) for a, b in pairs]
            return self.prepare(items, [params or PoolingParams()] * len(pairs), "score")
        self.check_task("score")
        # a cosine has no activation: use_activation does not apply (vLLM ignores it too)
        embed = PoolingParams(truncate_prompt_tokens=(params or PoolingParams())
                              .truncate_prompt_tokens, normalize=True)
        return self.prepare([a for a, _ in pairs] + [b for _, b in pairs],
                            [embed] * (2 * len(pairs)), "embed")

    def score_outputs(self, inputs: list[PoolingInput], data: list[np.ndarray]
                      ) -> list[PoolingRequestOutput]:
        if self.classifier is not None:
            return self.outputs(inputs, data)
        n = len(inputs) // 2
        outs = self.outputs(inputs[:n], data[:n])
        for i, out in enumerate(outs):
            cos = float(np.dot(data[i].astype(np.float64), data[n + i].astype(np.float64)))
            out.outputs = PoolingOutput(np.array([cos], np.float32))
            out.prompt_token_ids = inputs[i].token_ids + inputs[n + i].token_ids
        return outs

    def score_pairs(self, pairs: list[tuple], params: PoolingParams | None = None
                    ) -> list[PoolingRequestOutput]:
        inputs = self.prepare_score(pairs, params)
        return self.score_outputs(inputs, self.execute(inputs))


@dataclass
class PoolingInput:
    """One prompt ready to run: its tokens (and token types, for a cross-encoder's pair) and
    its verified PoolingParams."""

    token_ids: list[int]
    token_type_ids: list[int] | None
    params: PoolingParams


def _concat_ids(engine: PoolingEngine, a, b) -> dict:
    """A token-id pair for a cross-encoder: a's ids then b's, as the caller tokenized them."""
    ids_a, _ = engine.tokenize(a)
    ids_b, _ = engine.tokenize(b)
    return {"prompt_token_ids": ids_a + ids_b}
