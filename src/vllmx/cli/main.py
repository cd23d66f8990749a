"""The `vllmx` command: `vllmx serve [MODEL]` (the OpenAI-compatible server), `vllmx generate
[PROMPT]`, `vllmx chat`, `vllmx quantize` and `vllmx bench serve`."""

from __future__ import annotations

import argparse
import logging
import sys


def _generate(args: argparse.Namespace) -> int:
    from vllmx import LLM, SamplingParams

    llm = LLM(args.model, seed=args.seed or 0, max_model_len=args.max_model_len,
              num_threads=args.threads)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)
    else:
        out = llm.generate(args.prompt, params, use_tqdm=False)
    print(out[0].outputs[0].text)
    return 0


def main(argv: list[str] | None = None) -> int:
    from vllmx.loader.model_source import DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="vllmx")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete one prompt and print the text")
    g.add_argument("prompt", nargs="?", default="The capital of France is")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"checkpoint dir, .gguf file or built-in alias (default {DEFAULT_MODEL})")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("-v", "--verbose", action="store_true")
    c = sub.add_parser("chat", help="interactive chat with history (reads lines from stdin)")
    c.add_argument("--model", default=DEFAULT_MODEL)
    c.add_argument("--system", default=None, help="a system prompt")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--top-p", type=float, default=0.95)
    c.add_argument("--top-k", type=int, default=0)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--max-model-len", type=int, default=None)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("-v", "--verbose", action="store_true")
    from vllmx.cli.bench_serve import add_bench_parser
    from vllmx.cli.quantize import add_quantize_parser
    from vllmx.cli.serve import add_serve_parser

    add_serve_parser(sub)
    add_bench_parser(sub)
    add_quantize_parser(sub)
    args = parser.parse_args(argv)
    import vllmx  # noqa: F401  (sets up the "vllmx" logger: INFO to stderr, as vLLM does)

    if args.command in ("generate", "chat") and not args.verbose:
        logging.getLogger("vllmx").setLevel(logging.WARNING)  # only the text on stdout
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "chat":
            from vllmx.cli.chat import run_chat

            return run_chat(args)
        if args.command == "serve":
            from vllmx.cli.serve import run_serve

            return run_serve(args)
        if args.command == "quantize":
            from vllmx.cli.quantize import run_quantize

            return run_quantize(args)
        if args.command == "bench":
            from vllmx.cli.bench_serve import run_bench

            return run_bench(args)
    except ValueError as e:
        print(f"vllmx: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
