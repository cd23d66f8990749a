"""A thin HF-like tokenizer over a `tokenizers.Tokenizer` (no transformers at run time)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from vllmx.pages import release_free_heap

from .chat_template import render_chat_template, select_chat_template
from .gguf_vocab import build_gguf_tokenizer, template_post_processor

__all__ = ["Tokenizer", "get_tokenizer"]

_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


# Inputs longer than this (characters / ids) go through the tokenizers' batch calls, which
# release the GIL (the single-item calls hold it for the whole call: seconds for megabytes).
_LONG = 4096
_HUGE = 1 << 20  # past this, the heap the tokenizer freed is handed back to the OS at once


def _token_str(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    raise ValueError(f"Unrecognized special token entry: {value!r}")


def _added_token(value: Any, special: bool = True) -> AddedToken:
    if isinstance(value, dict):
        return AddedToken(
            value["content"],
            single_word=value.get("single_word", False),
            lstrip=value.get("lstrip", False),
            rstrip=value.get("rstrip", False),
            normalized=value.get("normalized", not special),
            special=value.get("special", special),
        )
    return AddedToken(value, special=special, normalized=not special)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _clean_up_tokenization(text: str) -> str:
    return (
        text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
    )


class Tokenizer:
    """HF-like tokenizer surface used by the serving stack.

    Build it with :meth:`from_pretrained_dir` (a checkpoint directory with tokenizer.json),
    :meth:`from_gguf_metadata` (GGUF metadata dict), or :func:`get_tokenizer`.
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        unk_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | dict[str, str] | None = None,
        clean_up_tokenization_spaces: bool = False,
        name_or_path: str | None = None,
    ):
        self._tok = tokenizer
        self._token_text: dict[int, str] = {}  # decode_token's cache
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.unk_token = unk_token
        self.pad_token = pad_token
        self._chat_template = chat_template
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self.name_or_path = name_or_path
        self._refresh()

    def _refresh(self) -> None:
        self._added = {i: a for i, a in self._tok.get_added_tokens_decoder().items()}
        named = [self.token_to_id(t) for t in (self.bos_token, self.eos_token, self.unk_token, self.pad_token)]
        ids: list[int] = []
        for i in named:
            if i is not None and i not in ids:
                ids.append(i)
        for i in sorted(self._added):
            if self._added[i].special and i not in ids:
                ids.append(i)
        self._all_special_ids = ids
        self._vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_pretrained_dir(cls, path: str | os.PathLike) -> Tokenizer:
        """Load from a Hugging Face checkpoint directory (tokenizer.json + tokenizer_config.json,
        optional special_tokens_map.json, chat_template.jinja, additional_chat_templates/*.jinja,
        chat_template.json)."""
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ValueError(f"{path} has no tokenizer.json (slow/sentencepiece-only tokenizers are not supported)")
        tok = HFTokenizer.from_file(str(tj))
        config = _read_json(path / "tokenizer_config.json")
        stmap = _read_json(path / "special_tokens_map.json")

        specials: dict[str, str | None] = {}
        raw_specials: dict[str, Any] = {}
        for name in _NAMED_SPECIAL:
            raw = config.get(name, stmap.get(name))
            raw_specials[name] = raw
            specials[name] = _token_str(raw)

        # Tokens the config lists that tokenizer.json lacks (transformers adds them).
        existing = {a.content for a in tok.get_added_tokens_decoder().values()}
        to_add: list[AddedToken] = []
        decoder_cfg = config.get("added_tokens_decoder") or {}
        for _, entry in sorted(decoder_cfg.items(), key=lambda kv: int(kv[0])):
            if isinstance(entry, dict) and entry.get("content") not in existing:
                to_add.append(_added_token(entry, special=entry.get("special", False)))
                existing.add(entry["content"])
        extra = (
            config.get("extra_special_tokens")
            or config.get("additional_special_tokens")
            or stmap.get("additional_special_tokens")
            or []
        )
        if isinstance(extra, dict):  # v5 may store named extras as a dict
            extra = list(extra.values())
        for name in _NAMED_SPECIAL:
            if specials[name] is not None and specials[name] not in existing:
                to_add.append(_added_token(raw_specials[name], special=True))
                existing.add(specials[name])
        for raw in extra:
            content = _token_str(raw)
            if content not in existing:
                to_add.append(_added_token(raw, special=True))
                existing.add(content)
        for token in to_add:
            if token.special:
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])

        # add_bos_token / add_eos_token, where the post-processor does not already add them.
        add_bos = bool(config.get("add_bos_token", False)) and specials["bos_token"] is not None
        add_eos = bool(config.get("add_eos_token", False)) and specials["eos_token"] is not None
        if add_bos or add_eos or tok.post_processor is None:
            probe = tok.encode("a", add_special_tokens=True).ids
            bare = tok.encode("a", add_special_tokens=False).ids
            bos_id = tok.token_to_id(specials["bos_token"]) if specials["bos_token"] else None
            eos_id = tok.token_to_id(specials["eos_token"]) if specials["eos_token"] else None
            has_bos = len(probe) > len(bare) and probe[0] == bos_id
            has_eos = len(probe) > len(bare) and probe[-1] == eos_id
            need_bos = add_bos and not has_bos
            need_eos = add_eos and not has_eos
            if tok.post_processor is None or need_bos or need_eos:
                tok.post_processor = template_post_processor(
                    tok,
                    specials["bos_token"] if (add_bos or has_bos) else None,
                    specials["eos_token"] if (add_eos or has_eos) else None,
                )

        chat_template = _load_chat_template(path, config)
        return cls(
            tok,
            bos_token=specials["bos_token"],
            eos_token=specials["eos_token"],
            unk_token=specials["unk_token"],
            pad_token=specials["pad_token"],
            chat_template=chat_template,
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
            name_or_path=str(path),
        )

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """Build from the metadata dict of a GGUF file
        (`vllmx.loader.gguf_file.GGUFFile(path).metadata`)."""
        v = build_gguf_tokenizer(meta)
        return cls(
            v.tokenizer,
            bos_token=v.bos_token,
            eos_token=v.eos_token,
            unk_token=v.unk_token,
            pad_token=v.pad_token,
            chat_template=v.chat_template,
            name_or_path=meta.get("general.name"),
        )

    @classmethod
    def from_gguf_file(cls, path: str | os.PathLike) -> Tokenizer:
        """Read a GGUF file's metadata and build its tokenizer."""
        from vllmx.loader.gguf_file import GGUFFile

        return cls.from_gguf_metadata(GGUFFile(str(path)).metadata)

    # ------------------------------------------------------------------ properties

    @property
    def backend_tokenizer(self) -> HFTokenizer:
        return self._tok

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def vocab_size(self) -> int:
        """Number of ids, including added tokens (== len(tokenizer))."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    @property
    def max_token_id(self) -> int:
        return max(self._tok.get_vocab(with_added_tokens=True).values())

    @property
    def all_special_ids(self) -> list[int]:
        """bos/eos/unk/pad ids, then every added token flagged special (ascending)."""
        return list(self._all_special_ids)

    @property
    def all_special_tokens(self) -> list[str]:
        return [self._tok.id_to_token(i) for i in self._all_special_ids]

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return dict(self._added)

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        return self._chat_template

    @chat_template.setter
    def chat_template(self, value: str | dict[str, str] | None) -> None:
        self._chat_template = value

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    # ------------------------------------------------------------------ encode / decode

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > _LONG:  # the batch call releases the GIL: other threads go on meanwhile
            ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
            if len(text) > _HUGE:
                release_free_heap()  # the encoding's scratch, freed just now
            return ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(
        self,
        ids: int | Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        if isinstance(ids, int):
            ids = [ids]
        ids = list(ids)
        if len(ids) > _LONG:  # as in encode: without the GIL
            text = self._tok.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        else:
            text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        cleanup = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        # transformers skips the clean-up for BPE models (it corrupts their output).
        if cleanup and type(self._tok.model).__name__ != "BPE":
            text = _clean_up_tokenization(text)
        return text

    def decode_token(self, token_id: int) -> str:
        """decode([token_id]) with special tokens kept, cached per id: logprobs name each
        step's top tokens one by one (5 top logprobs at batch 32: 192 decodes a step, ~2 us
        each through tokenizers)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.decode([token_id])
        return text

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        special = set(self._all_special_ids) if skip_special_tokens else ()
        return [self._tok.id_to_token(i) for i in ids if i not in special]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]):
        if isinstance(tokens, str):
            return self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._tok.decoder
        if decoder is None:
            return " ".join(tokens)
        return decoder.decode(list(tokens))

    # ------------------------------------------------------------------ chat

    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        return select_chat_template(self._chat_template, chat_template, tools)

    def _special_tokens_map(self) -> dict[str, str]:
        return {
            name: getattr(self, name) for name in _NAMED_SPECIAL if getattr(self, name) is not None
        }

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        **template_kwargs: Any,
    ) -> list[int] | str:
        """Render `messages` with the chat template; ids (encoded without adding special
        tokens, like transformers) when `tokenize`, else the text."""
        template = self.get_chat_template(chat_template, tools)
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        kwargs = {**self._special_tokens_map(), **template_kwargs}
        text = render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            **kwargs,
        )
        if tokenize:
            return self.encode(text, add_special_tokens=False)
        return text

    def tokenizer_info(self, model_max_length: int) -> dict[str, Any]:
        """vLLM's /tokenizer_info answer: the configuration transformers would report for this
        tokenizer (tokenizer_config.json's fields), the chat template rendered by default."""
        try:
            template = self.get_chat_template()
        except ValueError:  # none
            template = None
        named = set(self._special_tokens_map().values())
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "name_or_path": self.name_or_path,
            **self._special_tokens_map(),
            "chat_template": template,
            "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "additional_special_tokens": [a.content for _, a in sorted(self._added.items())
                                          if a.special and a.content not in named],
            "added_tokens_decoder": {
                str(i): {"content": a.content, "special": a.special, "lstrip": a.lstrip,
                         "rstrip": a.rstrip, "normalized": a.normalized,
                         "single_word": a.single_word}
                for i, a in sorted(self._added.items())},
        }

    def __repr__(self) -> str:
        return f"Tokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size})"


def _load_chat_template(path: Path, config: dict) -> str | dict[str, str] | None:
    templates: dict[str, str] = {}
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        templates["default"] = jinja_file.read_text(encoding="utf-8")
    extra_dir = path / "additional_chat_templates"
    if extra_dir.is_dir():
        for f in sorted(extra_dir.glob("*.jinja")):
            templates[f.name[: -len(".jinja")]] = f.read_text(encoding="utf-8")
    if templates:
        if len(templates) == 1 and "default" in templates:
            return templates["default"]
        return templates
    ct = config.get("chat_template")
    if ct is None:
        ct = _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(ct, (list, tuple)):
        ct = {t["name"]: t["template"] for t in ct}
    return ct


def get_tokenizer(source: str | os.PathLike | dict[str, Any]) -> Tokenizer:
    """Tokenizer from a GGUF metadata dict, a `.gguf` file path, or a checkpoint directory."""
    if isinstance(source, dict):
        return Tokenizer.from_gguf_metadata(source)
    p = Path(source)
    if p.is_file() and p.suffix == ".gguf":
        return Tokenizer.from_gguf_file(p)
    if p.is_dir():
        return Tokenizer.from_pretrained_dir(p)
    raise ValueError(f"Cannot find a tokenizer at {source!r} (expected a checkpoint directory or a .gguf file)")
