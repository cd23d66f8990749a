"""Build a `tokenizers.Tokenizer` from the vocabulary stored in GGUF metadata.

A GGUF file carries no `tokenizer.json`; llama.cpp stores the vocabulary under
`tokenizer.ggml.*` keys. This module rebuilds an equivalent Hugging Face
`tokenizers` object, following what transformers' GGUF converter builds for the
same file (so that ids agree with `AutoTokenizer.from_pretrained(dir,
gguf_file=...)`) and, where transformers has no opinion, what llama.cpp does.

Supported `tokenizer.ggml.model` values:

* ``"gpt2"``  -- byte-level BPE (tokens + merges); the pre-tokenizer split is
  chosen from ``tokenizer.ggml.pre``.
* ``"llama"`` -- SentencePiece BPE (tokens + scores + token_type) with byte
  fallback (``<0xNN>`` tokens) and the ``"▁"`` space marker.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

# llama.cpp token types (gguf.TokenType)
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

SPIECE_UNDERLINE = "\u2581"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# --------------------------------------------------------------------------------------------
# Pre-tokenizer splits for byte-level BPE, keyed by `tokenizer.ggml.pre`.
# The regexes are the ones of the models' own tokenizer.json files (which llama.cpp mirrors).
# --------------------------------------------------------------------------------------------

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Some code points below are written as escapes: NFC normalization would change them
# (e.g. U+1F7D, U+1FBE, U+2126 OHM SIGN, U+212A KELVIN SIGN) and break the ranges.
_DEEPSEEK_LLM_SPLITS = (
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
)

_DEEPSEEK_CODER_SPLITS = (
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
)

_DEEPSEEK_V3_SPLITS = (
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)


@dataclass(frozen=True)
class _PreSpec:
    kind: str  # "gpt2" (ByteLevel's own regex), "digits+gpt2", "splits"
    splits: tuple[str, ...] = ()
    ignore_merges: bool = False
    add_bos_default: bool = False


_GPT2 = _PreSpec("gpt2")
_DIGITS_GPT2 = _PreSpec("digits+gpt2")
_LLAMA3 = _PreSpec("splits", (_LLAMA3_SPLIT,), ignore_merges=True, add_bos_default=True)
_QWEN2 = _PreSpec("splits", (_QWEN2_SPLIT,))
_GPT4O = _PreSpec("splits", (_GPT4O_SPLIT,))

BPE_PRE_TOKENIZERS: dict[str, _PreSpec] = {
    # GPT-2 regex (ByteLevel's built-in one); also what transformers uses for unlisted `pre` values.
    "default": _GPT2,
    "gpt2": _GPT2,
    "gpt-2": _GPT2,
    "phi-2": _GPT2,
    "mpt": _GPT2,
    "olmo": _GPT2,
    "jais": _GPT2,
    "trillion": _GPT2,
    "exaone4": _GPT2,
    "granite-docling": _GPT2,
    "gigachat": _GPT2,
    "a.x-4.0": _GPT2,
    "mellum": _GPT2,
    "modern-bert": _GPT2,
    "jina-es": _GPT2,
    "jina-de": _GPT2,
    "jina-v2-es": _GPT2,
    "jina-v2-de": _GPT2,
    # GPT-2 regex after isolating every digit.
    "smollm": _DIGITS_GPT2,
    "starcoder": _DIGITS_GPT2,
    "refact": _DIGITS_GPT2,
    "command-r": _DIGITS_GPT2,
    "codeshell": _DIGITS_GPT2,
    "exaone": _DIGITS_GPT2,
    "minerva-7b": _DIGITS_GPT2,
    "mellum2": _DIGITS_GPT2,
    # Llama-3 family.
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "falcon3": _LLAMA3,
    "falcon-h1": _LLAMA3,
    "pixtral": _LLAMA3,
    "midm-2.0": _LLAMA3,
    "lfm2": _LLAMA3,
    "jina-v5-nano": _LLAMA3,
    "dbrx": _PreSpec("splits", (_LLAMA3_SPLIT,)),
    "smaug-bpe": _PreSpec("splits", (_LLAMA3_SPLIT,)),
    "chatglm-bpe": _PreSpec("splits", (_LLAMA3_SPLIT,)),
    "glm4": _PreSpec("splits", (_LLAMA3_SPLIT,)),
    # Qwen2 family.
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "kormo": _QWEN2,
    "f2llmv2": _QWEN2,
    "megrez": _QWEN2,
    "stablelm2": _QWEN2,
    "hunyuan": _QWEN2,
    "solar-open": _QWEN2,
    "qwen35": _PreSpec("splits", (_QWEN35_SPLIT,)),
    # Others.
    "tekken": _PreSpec("splits", (_TEKKEN_SPLIT,), ignore_merges=True, add_bos_default=True),
    "gpt-4o": _GPT4O,
    "llama4": _GPT4O,
    "kanana2": _GPT4O,
    "talkie": _GPT4O,
    "minimax-m2": _GPT4O,
    "deepseek-llm": _PreSpec("splits", _DEEPSEEK_LLM_SPLITS),
    "deepseek-coder": _PreSpec("splits", _DEEPSEEK_CODER_SPLITS),
    "deepseek-v3": _PreSpec("splits", _DEEPSEEK_V3_SPLITS),
}


def _byte_level_pre_tokenizer(spec: _PreSpec):
    if spec.kind == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if spec.kind == "digits+gpt2":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in spec.splits]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


# --------------------------------------------------------------------------------------------


@dataclass
class GGUFVocab:
    """The result of :func:`build_gguf_tokenizer`."""

    tokenizer: HFTokenizer
    bos_token: str | None = None
    eos_token: str | None = None
    unk_token: str | None = None
    pad_token: str | None = None
    add_bos_token: bool = False
    add_eos_token: bool = False
    chat_template: str | dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _get(meta: dict, key: str, default=None):
    return meta.get(f"tokenizer.ggml.{key}", default)


def generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary: every split of a token into two
    vocabulary tokens, best-scoring merged token first (transformers' `generate_merges`, same
    order). Candidates are gathered as numbers, not tuples of new strings, and the result
    reuses the vocabulary's strings: Gemma 3's 262k tokens give 515k merges."""
    token_of = {i: t for t, i in vocab.items()}
    ints = [array("q") for _ in range(5)]  # left id, right id, piece, len left, len right
    left, right, piece, len_left, len_right = ints
    score = array("d")
    for p, (token, token_score) in enumerate(scores.items()):
        for i in range(1, len(token)):
            a, b = vocab.get(token[:i]), vocab.get(token[i:])
            if a is not None and b is not None:
                left.append(a), right.append(b), piece.append(p), score.append(token_score)
                len_left.append(i), len_right.append(len(token) - i)
    if not left:
        return []
    # transformers sorts each piece's splits by (left id, right id), concatenates the pieces in
    # order, then stable-sorts by (score, len left, len right) descending; lexsort's last key
    # is its primary one.
    r, lf, pc, ll, lr = (np.frombuffer(a, np.int64) for a in ints)
    order = np.lexsort((r, lf, pc, -lr, -ll, -np.frombuffer(score, np.float64)))
    return [(token_of[left[k]], token_of[right[k]]) for k in order.tolist()]


def _sentencepiece_tokenizer(meta: dict) -> tuple[HFTokenizer, bool]:
    tokens: list[str] = _get(meta, "tokens")
    scores = _get(meta, "scores")
    if scores is None:
        raise ValueError("GGUF sentencepiece ('llama') vocabulary has no tokenizer.ggml.scores")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if _get(meta, "merges") is not None:
        merges = [tuple(m.split(" ", 1)) for m in _get(meta, "merges")]
    else:
        merges = generate_merges(vocab, dict(zip(tokens, scores)))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
    add_prefix = bool(_get(meta, "add_space_prefix", True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPIECE_UNDERLINE, prepend_scheme="first" if add_prefix else "never", split=False
    )
    seq = [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        seq.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(seq)
    return tok, True


def _byte_level_tokenizer(meta: dict) -> tuple[HFTokenizer, bool]:
    pre = _get(meta, "pre") or "default"
    spec = BPE_PRE_TOKENIZERS.get(pre)
    if spec is None:
        raise ValueError(
            f"Unsupported GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} for a byte-level BPE vocabulary; "
            f"known: {sorted(BPE_PRE_TOKENIZERS)}"
        )
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, tok in enumerate(_get(meta, "tokens")):
        if not set(tok) <= alphabet:
            tok = "".join(spelling[b] for b in tok.encode("utf-8"))
        vocab[tok] = i
    merges_raw = _get(meta, "merges")
    if merges_raw is None:
        raise ValueError("GGUF byte-level BPE ('gpt2') vocabulary has no tokenizer.ggml.merges")
    merges = [tuple(m.split(" ", 1)) for m in merges_raw]
    tok = HFTokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=spec.ignore_merges,
        )
    )
    tok.normalizer = None
    tok.pre_tokenizer = _byte_level_pre_tokenizer(spec)
    tok.decoder = decoders.ByteLevel()
    return tok, spec.add_bos_default


_BUILDERS = {
    "gpt2": _byte_level_tokenizer,
    "llama": _sentencepiece_tokenizer,
}


def _chat_template_from_meta(meta: dict) -> str | dict[str, str] | None:
    default = meta.get("tokenizer.chat_template")
    named = {
        k[len("tokenizer.chat_template.") :]: v
        for k, v in meta.items()
        if k.startswith("tokenizer.chat_template.") and isinstance(v, str)
    }
    if not named:
        return default
    if default is not None:
        named["default"] = default
    return named


def build_gguf_tokenizer(meta: dict[str, Any]) -> GGUFVocab:
    """Build the tokenizer described by GGUF metadata (as read by
    `vllmx.loader.gguf_metadata.read_gguf_metadata`)."""
    model = _get(meta, "model")
    if model not in _BUILDERS:
        raise ValueError(
            f"Unsupported GGUF tokenizer model tokenizer.ggml.model={model!r}; supported: {sorted(_BUILDERS)}"
        )
    tokens: list[str] | None = _get(meta, "tokens")
    if not tokens:
        raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
    tok, add_bos_default = _BUILDERS[model](meta)
    token_types = _get(meta, "token_type") or []

    def tok_for(key: str) -> str | None:
        idx = _get(meta, key)
        if idx is None or not (0 <= int(idx) < len(tokens)):
            return None
        return tokens[int(idx)]

    bos, eos = tok_for("bos_token_id"), tok_for("eos_token_id")
    unk, pad = tok_for("unknown_token_id"), tok_for("padding_token_id")

    # Control tokens -> special added tokens; user-defined -> plain added tokens.
    alphabet = set(bytes_to_unicode().values()) if model == "gpt2" else None
    control = [
        t for t, ty in zip(tokens, token_types) if ty == TOKEN_TYPE_CONTROL and (alphabet is None or set(t) <= alphabet)
    ]
    if control:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    vocab = tok.get_vocab(with_added_tokens=True)
    user = [t for t, ty in zip(tokens, token_types) if ty == TOKEN_TYPE_USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    # Named special tokens are special too (transformers adds them when missing).
    named = []
    existing = {a.content for a in tok.get_added_tokens_decoder().values()}
    for t in (bos, eos, unk, pad):
        if t is not None and t not in existing and t not in named:
            named.append(t)
    if named:
        tok.add_special_tokens([AddedToken(t, special=True) for t in named])

    add_bos = bool(_get(meta, "add_bos_token", True if model == "llama" else add_bos_default))
    add_eos = bool(_get(meta, "add_eos_token", False))
    if bos is None:
        add_bos = False
    if eos is None:
        add_eos = False
    tok.post_processor = template_post_processor(tok, bos if add_bos else None, eos if add_eos else None)
    return GGUFVocab(
        tokenizer=tok,
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        pad_token=pad,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        chat_template=_chat_template_from_meta(meta),
        extra={"model": model, "pre": _get(meta, "pre")},
    )


def template_post_processor(tok: HFTokenizer, bos: str | None, eos: str | None) -> processors.TemplateProcessing:
    """`[bos] $A [eos]` (and the pair form), like transformers' `update_post_processor`."""
    single = f"{bos + ':0 ' if bos else ''}$A:0{' ' + eos + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if bos else ''} $B:1{' ' + eos + ':1' if eos else ''}"
    special = []
    if bos:
        special.append((bos, tok.token_to_id(bos)))
    if eos and eos != bos:
        special.append((eos, tok.token_to_id(eos)))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
