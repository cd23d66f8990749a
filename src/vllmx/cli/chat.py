"""`vllmx chat`: an interactive, offline chat with history, streaming the reply as it is
generated. Commands: /reset clears the history, /exit (or Ctrl-D) quits."""

from __future__ import annotations

import sys

from vllmx.sampling_params import RequestOutputKind, SamplingParams


def stream_reply(engine, messages: list[dict], params: SamplingParams, out=sys.stdout) -> str:
    tok = engine.tokenizer
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    rid = engine.add_request(None, {"prompt_token_ids": ids}, params)
    text = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id != rid:
                continue
            delta = o.outputs[0].text
            text.append(delta)
            out.write(delta)
            out.flush()
    out.write("\n")
    return "".join(text)


def run_chat(args) -> int:
    from vllmx.engine.arg_utils import EngineArgs
    from vllmx.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=args.model, seed=args.seed or 0, max_model_len=args.max_model_len,
        num_threads=args.threads))
    if engine.tokenizer is None or engine.tokenizer.chat_template is None:
        print("vllmx: error: this model has no chat template", file=sys.stderr)
        return 2
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            output_kind=RequestOutputKind.DELTA)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        line = line.rstrip("\n")
        if line.strip() == "/reset":
            history.clear()
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            reply = stream_reply(engine, system + history, params)
        except ValueError as e:  # e.g. the conversation outgrew the context
            print(f"vllmx: error: {e}", file=sys.stderr)
            history.pop()
            continue
        history.append({"role": "assistant", "content": reply})
