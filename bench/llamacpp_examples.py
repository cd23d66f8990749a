"""llama.cpp's speculative-decoding examples as peers: llama-lookup (prompt lookup decoding:
n-grams of 1 to 4 tokens from the context) and llama-speculative-simple (a draft model), run
one prompt after another (the examples decode one sequence), the prompts as text (llama.cpp
applies nothing: pass them templated; it tokenizes them, special tokens parsed). Build them
with -DLLAMA_BUILD_EXAMPLES=ON (targets llama-lookup, llama-speculative-simple)."""

from __future__ import annotations

import os
import re
import subprocess

_TIMER = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"n_accept\s+=\s+(\d+)")
_DRAFTED = re.compile(r"n_drafted\s+=\s+(\d+)")


def llamacpp_spec(bin_dir: str, gguf: str, texts: list[str], max_tokens: int, k: int,
                  repeats: int, draft: str | None = None, threads: int | None = None,
                  ngl: int = 99) -> dict:
    """llama-lookup (draft None; k 0: plain decoding) or llama-speculative-simple with the
    draft model `draft` over the prompts, k drafts a step at most (the draft's own defaults
    otherwise, e.g. its p_min cut): new tokens over its encode + decode seconds (its own
    timers, loading not counted), the median of repeats; its acceptance."""
    binary = os.path.join(bin_dir, "llama-speculative-simple" if draft else "llama-lookup")
    cmd = [binary, "-m", gguf, "-n", str(max_tokens), "--spec-draft-n-max", str(k),
           "-ngl", str(ngl), "--temp", "0", "-c", "2048"]
    if draft:
        cmd += ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-ngl", str(ngl)]
    if threads:
        cmd += ["-t", str(threads), "-tb", str(threads)]
        if draft:
            cmd += ["-td", str(threads), "-tbd", str(threads)]
    runs, acc = [], [0, 0]
    for _ in range(repeats):
        tokens = prompt_tokens = 0
        seconds = 0.0
        for text in texts:
            p = subprocess.run(cmd + ["-p", text], capture_output=True, text=True, timeout=600,
                               check=False)
            log = p.stdout + p.stderr
            found = {m[0]: (int(m[1]), float(m[2])) for m in _TIMER.findall(log)}
            if p.returncode != 0 or set(found) != {"encoded", "decoded"}:
                raise RuntimeError(f"{os.path.basename(binary)} failed (rc {p.returncode}): "
                                   f"{log[-2000:]}")
            prompt_tokens += found["encoded"][0]
            tokens += found["decoded"][0]
            seconds += found["encoded"][1] + found["decoded"][1]
            for m, i in ((_ACCEPT.search(log), 0), (_DRAFTED.search(log), 1)):
                acc[i] += int(m[1]) if m else 0
        runs.append((seconds, tokens, prompt_tokens))
    seconds, tokens, prompt_tokens = sorted(runs)[len(runs) // 2]
    return {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds,
            "prompt_tokens": prompt_tokens,
            **({"acceptance": acc[0] / max(1, acc[1])} if k else {})}
