"""`vllmx serve [MODEL]`: the OpenAI-compatible server, with vLLM's flag names. With no
model it serves the built-in default (SmolLM2-135M-Instruct; with --runner pooling,
all-MiniLM-L6-v2)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from vllmx.config import FINGERPRINT_MODES, LOAD_FORMATS, MAMBA_SSM_CACHE_DTYPES

logger = logging.getLogger("vllmx")


def _memory_bytes(text: str) -> int:
    """An int, optionally with a K/M/G/T suffix (binary: 1G = 2**30), as vLLM accepts."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def _count(text: str) -> int:
    """A count (>= 0), refused by argparse before anything loads."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def add_serve_parser(sub) -> argparse.ArgumentParser:
    from vllmx.loader.model_source import DEFAULT_MODEL

    p = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server")
    p.add_argument("model", nargs="?", default=None,
                   help=f"checkpoint dir, .gguf file or built-in alias (default {DEFAULT_MODEL})")
    p.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    p.add_argument("--host", default=None, help="host to bind (default: all interfaces)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("VLLMX_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (env VLLMX_API_KEY)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="the model name(s) the API accepts (default: MODEL)")
    p.add_argument("--chat-template", default=None, help="a chat template file or string")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None)
    # vLLM's flags for what vllmx always does: prefills are chunked to the step's token budget
    # (--no-enable-chunked-prefill is refused, not ignored), and the API server and the engine
    # share one process (vLLM's --disable-frontend-multiprocessing).
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="on always (vLLM's flag; --no-... is refused)")
    p.add_argument("--disable-frontend-multiprocessing", action="store_true",
                   help="vLLM's flag; vllmx's server and engine share one process already")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--kv-cache-memory-bytes", type=_memory_bytes, default=None,
                   help="KV cache size, e.g. 2G (default: a share of RAM)")
    p.add_argument("--mamba-ssm-cache-dtype", default=None, choices=MAMBA_SSM_CACHE_DTYPES,
                   help="hybrid models' recurrent states' dtype (vLLM's flag; default float32; "
                        "auto: the activations', on the GPU)")
    p.add_argument("--speculative-config", default=None,
                   help="speculative decoding, vLLM's JSON, e.g. "
                        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    p.add_argument("--structured-outputs-config", default=None,
                   help="structured outputs' engine defaults, vLLM's JSON, e.g. "
                        "'{\"backend\": \"guidance\", \"disable_any_whitespace\": true}'")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="parse tool calls from the output for tool_choice 'auto' (needs "
                        "--tool-call-parser)")
    p.add_argument("--tool-call-parser", default=None,
                   help="the model family's tool call format, vLLM's names: hermes, "
                        "llama3_json, mistral, pythonic, qwen3_coder, ...")
    p.add_argument("--reasoning-parser", default=None,
                   help="split the reasoning from the answer (a message's `reasoning`), vLLM's "
                        "names: deepseek_r1, qwen3, glm45, granite, mistral, minimax_m2, ...")
    p.add_argument("--runner", choices=["auto", "generate", "pooling"], default="auto",
                   help="auto: by the checkpoint's architecture (vLLM's --runner)")
    p.add_argument("--convert", choices=["auto", "none", "embed", "classify"], default="auto",
                   help="serve a generative checkpoint as a pooling model, e.g. 'embed' "
                        "(last-token pooling, as Qwen3-Embedding)")
    p.add_argument("--pooler-config", default=None,
                   help="vLLM's JSON, e.g. '{\"pooling_type\": \"MEAN\", \"normalize\": true}'")
    p.add_argument("--hf-overrides", default=None,
                   help="vLLM's JSON merged over config.json, e.g. a Qwen3-Reranker's "
                        "'{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                        "\"classifier_from_token\": [\"no\", \"yes\"]}'")
    p.add_argument("--quantization", "-q", default=None,
                   help="vLLM's: the method the checkpoint is quantized with (awq, gptq, fp8, "
                        "compressed-tensors, gguf), checked against its quantization_config; "
                        "default: whatever that says")
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (vLLM's)")
    p.add_argument("--lora-modules", nargs="+", default=[],
                   help="adapters served by name: name=path or JSON {\"name\", \"path\", "
                        "\"base_model_name\"} (needs --enable-lora)")
    p.add_argument("--max-loras", type=int, default=None, help="most adapters in one step")
    p.add_argument("--max-lora-rank", type=int, default=None, help="largest adapter rank")
    p.add_argument("--lora-dtype", default=None, choices=["auto", "float32", "float16",
                                                          "bfloat16"],
                   help="the adapters' weights as applied (default auto: the model's)")
    p.add_argument("--max-cpu-loras", type=int, default=None,
                   help="adapters kept loaded (default: --max-loras)")
    p.add_argument("--allow-runtime-lora-updating", action="store_true",
                   help="add /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generation-config", default="auto",
                   help="'auto' (the model's generation_config.json), 'vllm' (none), or a dir")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads a rank (default: the cores, shared by the ranks)")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=None,
                   help="ranks (processes) each holding a share of every layer (CPU so far)")
    p.add_argument("-pp", "--pipeline-parallel-size", type=int, default=None,
                   help="pipeline stages (processes) each holding a run of layers (CPU so far)")
    p.add_argument("--enable-expert-parallel", action="store_true", default=None,
                   help="split a MoE's experts whole across the tensor-parallel ranks")
    p.add_argument("--distributed-executor-backend", choices=["mp", "ray", "uni"],
                   default=None, help="what launches the further ranks (default: mp)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: the GPU when a usable one is present, else the CPU")
    p.add_argument("--dtype", default="auto",
                   help="GPU activations: auto (the checkpoint's bf16/f16, else bf16), bfloat16, "
                        "float16; the CPU computes in float32")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of GPU memory for weights, activations and KV cache (default 0.9)")
    p.add_argument("--load-format", default="auto",
                   choices=LOAD_FORMATS,
                   help="'dummy': random weights from config.json alone (benchmarking shapes "
                        "without their files), as vLLM's")
    p.add_argument("--enforce-eager", action="store_true",
                   help="run decode steps eagerly (no CUDA graphs / CPU step tapes)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule and launch step N + 1 before step N's tokens reach the host "
                        "(default: on for the GPU without speculative decoding)")
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="serve /tokenizer_info (the tokenizer's configuration, chat template "
                        "and special tokens included)")
    p.add_argument("--enable-server-load-tracking", action="store_true",
                   help="count the requests in flight for /load")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage.prompt_tokens_details.cached_tokens: the prompt tokens the "
                        "prefix cache held")
    p.add_argument("--enable-per-request-metrics", action="store_true",
                   help="responses carry `metrics`: time to first token, queue and generation "
                        "time, mean inter-token latency, tokens per second (a stream's usage "
                        "chunk)")
    p.add_argument("--enable-force-include-usage", action="store_true",
                   help="every stream ends with a usage chunk and carries usage on each chunk")
    p.add_argument("--fingerprint-mode", choices=FINGERPRINT_MODES, default="full",
                   help="system_fingerprint: full / hash 'vllmx-<version>-<config hash>', "
                        "custom: --fingerprint-value, none: null")
    p.add_argument("--fingerprint-value", default=None,
                   help="the system_fingerprint of --fingerprint-mode custom")
    p.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="logprobs name tokens 'token_id:<id>' (a request's "
                        "return_tokens_as_token_ids overrides it)")
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--show-hidden-metrics-for-version", default=None, metavar="X.Y",
                   help="also serve the deprecated metrics vLLM hid after version X.Y "
                        "(vllm:gpu_cache_usage_perc, ...), each mirroring its replacement, as "
                        "vLLM's escape hatch")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="most logprobs / prompt_logprobs a request may ask for; -1: no limit "
                        "(default 20, as vLLM)")
    p.add_argument("--max-logprob-entries", type=int, default=1 << 22,
                   help="most logprob entries one request may hold: tokens x (logprobs + 1), "
                        "prompt logprobs, times n; more is a 400 before it runs (default 4194304, "
                        "about 1.4 GB)")
    p.add_argument("--max-request-body-bytes", type=_memory_bytes, default=None,
                   help="larger request bodies get 413, unread (default 16M)")
    p.add_argument("--max-stored-responses", type=_count, default=None,
                   help="/v1/responses with store=true kept in memory for GET and "
                        "previous_response_id, the oldest dropped first; 0: none kept "
                        "(default 1024)")
    # CORS: vLLM's flags and defaults.
    p.add_argument("--allowed-origins", nargs="+", default=["*"], help="CORS origins")
    p.add_argument("--allowed-methods", nargs="+", default=["*"], help="CORS methods")
    p.add_argument("--allowed-headers", nargs="+", default=["*"], help="CORS headers")
    p.add_argument("--allow-credentials", action="store_true", help="CORS credentials")
    # vLLM's drain shutdown flags; the default here is to drain (vLLM's is immediate) so that
    # a rolling restart loses no request that can finish in time.
    p.add_argument("--shutdown-mode", choices=["drain", "immediate"], default="drain",
                   help="on SIGTERM: 'drain' stops accepting, lets the requests in flight "
                        "finish (up to --shutdown-drain-timeout), then aborts the rest; "
                        "'immediate' aborts them at once")
    p.add_argument("--shutdown-drain-timeout", type=float, default=120.0,
                   help="seconds a drain waits for the requests in flight (default 120)")
    return p


def _structured_outputs_config(args: argparse.Namespace) -> str | None:
    """--structured-outputs-config, with --reasoning-parser as its reasoning_parser (vLLM's:
    constraints then apply to the answer after the reasoning)."""
    cfg = args.structured_outputs_config
    if not getattr(args, "reasoning_parser", None):
        return cfg
    try:
        d = json.loads(cfg) if cfg else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"--structured-outputs-config is not valid JSON: {e}") from e
    if isinstance(d, dict):
        d.setdefault("reasoning_parser", args.reasoning_parser)
    return json.dumps(d)


def engine_args_from(args: argparse.Namespace):
    """EngineArgs from the flags; a flag this engine has no field for is a clear error."""
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.loader.model_source import DEFAULT_MODEL, DEFAULT_POOLING_MODEL

    if getattr(args, "enable_chunked_prefill", None) is False:
        raise ValueError("--no-enable-chunked-prefill: vllmx always chunks prefills to "
                         "--max-num-batched-tokens (vLLM's default); it has no unchunked mode")
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    default = DEFAULT_POOLING_MODEL if args.runner == "pooling" else DEFAULT_MODEL
    kwargs = {"model": args.model_flag or args.model or default, "seed": args.seed,
              "runner": args.runner, "convert": args.convert,
              "pooler_config": args.pooler_config, "hf_overrides": args.hf_overrides,
              "generation_config": args.generation_config, "device": args.device,
              "dtype": args.dtype, "gpu_memory_utilization": args.gpu_memory_utilization,
              "enforce_eager": args.enforce_eager, "max_logprobs": args.max_logprobs,
              "max_logprob_entries": args.max_logprob_entries,
              "load_format": args.load_format, "enable_lora": args.enable_lora}
    optional = {"tokenizer": args.tokenizer, "max_model_len": args.max_model_len,
                "max_num_seqs": args.max_num_seqs,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "enable_prefix_caching": args.enable_prefix_caching,
                "block_size": args.block_size,
                "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
                "mamba_ssm_cache_dtype": args.mamba_ssm_cache_dtype,
                "speculative_config": args.speculative_config,
                "quantization": args.quantization,
                "structured_outputs_config": _structured_outputs_config(args),
                "async_scheduling": args.async_scheduling,
                "num_threads": args.threads, "max_loras": args.max_loras,
                "tensor_parallel_size": args.tensor_parallel_size,
                "pipeline_parallel_size": args.pipeline_parallel_size,
                "enable_expert_parallel": args.enable_expert_parallel,
                "distributed_executor_backend": args.distributed_executor_backend,
                "max_lora_rank": args.max_lora_rank, "max_cpu_loras": args.max_cpu_loras,
                "lora_dtype": args.lora_dtype,
                "show_hidden_metrics_for_version": args.show_hidden_metrics_for_version}
    for name, value in optional.items():
        if value is None:
            continue
        if name not in fields:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is not supported by this engine yet (EngineArgs has no "
                             f"{name!r})")
        kwargs[name] = value
    return EngineArgs(**kwargs)


def load_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a template")
    return value


# After an engine fault: how long the requests in flight get to receive their error before
# the process exits (non-zero), so that a supervisor restarts it within seconds.
_DEAD_ENGINE_GRACE_S = 2.0


def _make_server(app, config):
    """uvicorn's Server, plus what a model server needs on the way down: a signal starts a
    drain (app.state.draining: /health 503, new requests 503) for at most the drain timeout,
    and engine_dead() (called from the engine thread) stops the server at once."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.draining = True
            super().handle_exit(sig, frame)

        def engine_dead(self) -> None:
            timeout = self.config.timeout_graceful_shutdown
            self.config.timeout_graceful_shutdown = min(timeout or _DEAD_ENGINE_GRACE_S,
                                                        _DEAD_ENGINE_GRACE_S)
            self.should_exit = True

    return Server(config)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from vllmx.engine.factory import create_engine_client
    from vllmx.server.app import DEFAULT_MAX_REQUEST_BODY_BYTES, build_app, check_parser_flags
    from vllmx.server.serving_models import parse_lora_modules
    from vllmx.server.serving_responses import DEFAULT_MAX_STORED_RESPONSES

    logging.getLogger("vllmx").setLevel(logging.INFO)
    # Bad parser flags fail before the model loads.
    check_parser_flags(args.enable_auto_tool_choice, args.tool_call_parser,
                       args.reasoning_parser)
    engine_args = engine_args_from(args)
    lora_modules = parse_lora_modules(args.lora_modules)
    if (lora_modules or args.allow_runtime_lora_updating) and not args.enable_lora:
        raise ValueError("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
    chat_template = load_chat_template(args.chat_template)
    engine_client = create_engine_client(engine_args)
    try:
        app = build_app(engine_client, args.served_model_name or [engine_args.model],
                        chat_template=chat_template, api_key=args.api_key,
                        allowed_origins=args.allowed_origins,
                        allowed_methods=args.allowed_methods,
                        allowed_headers=args.allowed_headers,
                        allow_credentials=args.allow_credentials,
                        max_request_body_bytes=(args.max_request_body_bytes
                                                or DEFAULT_MAX_REQUEST_BODY_BYTES),
                        log_requests=not args.disable_log_requests,
                        enable_tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
                        enable_server_load_tracking=args.enable_server_load_tracking,
                        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                        enable_per_request_metrics=args.enable_per_request_metrics,
                        enable_force_include_usage=args.enable_force_include_usage,
                        fingerprint_mode=args.fingerprint_mode,
                        fingerprint_value=args.fingerprint_value,
                        enable_auto_tool_choice=args.enable_auto_tool_choice,
                        tool_call_parser=args.tool_call_parser,
                        reasoning_parser=args.reasoning_parser, lora_modules=lora_modules,
                        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
                        max_stored_responses=(DEFAULT_MAX_STORED_RESPONSES
                                              if args.max_stored_responses is None
                                              else args.max_stored_responses),
                        log_stats_interval=None if args.disable_log_stats else 10.0)
        drain = args.shutdown_drain_timeout if args.shutdown_mode == "drain" else 0.0
        server = _make_server(app, uvicorn.Config(
            app, host=args.host or "0.0.0.0", port=args.port, log_level=args.uvicorn_log_level,
            timeout_keep_alive=5, timeout_graceful_shutdown=drain))
        engine_client.add_dead_callback(server.engine_dead)
        logger.info("serving %s on http://%s:%d/v1", engine_args.model, args.host or "0.0.0.0",
                    args.port)
        server.run()
    finally:
        engine_client.shutdown()
    if engine_client.errored:
        logger.error("exiting: the engine has stopped (%s)", engine_client.dead_error)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="vllmx")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    sys.exit(run_serve(parser.parse_args()))
