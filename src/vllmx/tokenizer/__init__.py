"""Tokenizers for vllmx: HF tokenizer.json directories and GGUF vocabularies.

Exports:
    Tokenizer            -- HF-like wrapper over a `tokenizers.Tokenizer`
                            (Tokenizer.from_pretrained_dir / from_gguf_metadata / from_gguf_file).
    get_tokenizer(src)   -- factory: GGUF metadata dict, `.gguf` path, or checkpoint directory.
    build_gguf_tokenizer -- low level: GGUF metadata -> GGUFVocab (tokenizers object + specials).
    render_chat_template -- sandboxed jinja2 chat-template rendering (transformers semantics).
    ChatTemplateError    -- ValueError raised by templates (`raise_exception`) and render errors.
"""

from .chat_template import ChatTemplateError, compile_chat_template, render_chat_template, select_chat_template
from .gguf_vocab import BPE_PRE_TOKENIZERS, GGUFVocab, build_gguf_tokenizer
from .tokenizer import Tokenizer, get_tokenizer

__all__ = [
    "BPE_PRE_TOKENIZERS",
    "ChatTemplateError",
    "GGUFVocab",
    "Tokenizer",
    "build_gguf_tokenizer",
    "compile_chat_template",
    "get_tokenizer",
    "render_chat_template",
    "select_chat_template",
]
