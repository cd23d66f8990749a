"""vllmx vs sentence-transformers (torch CPU) embedding throughput on the same checkpoint, same
threads, in one run, alternating engines: batches of --batch texts of exactly --seq-len tokens
(special tokens included; the issue's workload: MiniLM, batch 64, 128 tokens), medians of
--repeats timed runs after a warm-up. Checks first that both give the same vectors (cosine),
then prints sentences/s of each and the ratio, and writes JSON under bench/results/.

    python bench/embed_cpu_vs_st.py [--model PATH] [--threads 2] [--batch 64] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from cpu_vs_llamacpp_lib import cpu_name, git_commit, write_result


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the built-in MiniLM)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    return ap.parse_args()


def texts_of_len(tokenizer, n: int, seq_len: int) -> list[str]:
    """n distinct texts of exactly seq_len tokens with [CLS] / [SEP]: random vocabulary words
    cut to fit, then topped up with the one-token word "a"."""
    rng = np.random.default_rng(0)
    vocab = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 3]
    out = []
    for _ in range(n):
        words = list(rng.choice(vocab, seq_len))
        while len(words) > 1 and len(tokenizer.encode(" ".join(words))) > seq_len:
            words.pop()
        while len(tokenizer.encode(" ".join(words))) < seq_len:
            words.append("a")
        text = " ".join(words)
        if len(tokenizer.encode(text)) != seq_len:
            raise ValueError(f"could not make a {seq_len}-token text with this tokenizer")
        out.append(text)
    return out


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    args = parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    from vllmx import LLM, __version__
    from vllmx.loader.model_source import DEFAULT_POOLING_MODEL, fetch_builtin

    torch.set_num_threads(args.threads)
    path = args.model or fetch_builtin(DEFAULT_POOLING_MODEL)
    llm = LLM(path, num_threads=args.threads, max_num_batched_tokens=args.batch * args.seq_len,
              max_num_seqs=args.batch)
    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = args.seq_len
    texts = texts_of_len(llm.get_tokenizer(), args.batch, args.seq_len)

    ours = np.array([o.outputs.embedding for o in llm.embed(texts)])
    theirs = st.encode(texts, batch_size=args.batch, convert_to_numpy=True)
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cos.min() >= 0.9999, f"vectors differ: min cosine {cos.min()}"

    def run_vllmx():
        llm.embed(texts)

    def run_st():
        st.encode(texts, batch_size=args.batch)

    run_vllmx(), run_st()  # warm-up
    t_vllmx, t_st = [], []
    for _ in range(args.repeats):  # alternating, so that drift hits both
        t_vllmx.append(seconds(run_vllmx))
        t_st.append(seconds(run_st))
    v, s = args.batch / statistics.median(t_vllmx), args.batch / statistics.median(t_st)
    print(f"{os.path.basename(path)}, batch {args.batch} x {args.seq_len} tokens, "
          f"{args.threads} threads")
    print(f"  vllmx {v:8.1f} sentences/s   sentence-transformers {s:8.1f}   ratio {v / s:.2f}x")
    import sentence_transformers

    write_result("embed_cpu_vs_st.json", {
        "machine": {"cpu": cpu_name(), "platform": platform.platform(), "threads": args.threads},
        "commit": git_commit(), "vllmx": __version__, "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "model": os.path.basename(path), "batch": args.batch, "seq_len": args.seq_len,
        "min_cosine": float(cos.min()), "vllmx_sentences_per_s": v,
        "sentence_transformers_sentences_per_s": s, "ratio": v / s,
        "vllmx_times_s": t_vllmx, "sentence_transformers_times_s": t_st})


if __name__ == "__main__":
    main()
