"""A tokenizer.json checkpoint directory (saved by transformers) vs transformers loading it."""

from __future__ import annotations

import json

import pytest

from test_gguf_bpe import CONVERSATIONS, TEXTS


@pytest.fixture(scope="session")
def saved_dir(smollm_hf, tmp_path_factory):
    d = tmp_path_factory.mktemp("smollm_tok")
    smollm_hf.save_pretrained(str(d))
    return d


@pytest.fixture(scope="session")
def dir_pair(saved_dir):
    transformers = pytest.importorskip("transformers")
    from vllmx.tokenizer import Tokenizer

    return Tokenizer.from_pretrained_dir(saved_dir), transformers.AutoTokenizer.from_pretrained(str(saved_dir))


def test_dir_encode_decode(dir_pair):
    mine, theirs = dir_pair
    for text in TEXTS:
        for add in (True, False):
            ids = mine.encode(text, add_special_tokens=add)
            assert ids == theirs.encode(text, add_special_tokens=add), text
        assert mine.decode(ids) == theirs.decode(ids)
        assert mine.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


def test_dir_properties_and_chat(dir_pair):
    mine, theirs = dir_pair
    assert mine.bos_token_id == theirs.bos_token_id
    assert mine.eos_token_id == theirs.eos_token_id
    assert mine.pad_token_id == theirs.pad_token_id
    assert mine.vocab_size == len(theirs)
    assert mine.chat_template == theirs.chat_template
    for conv in CONVERSATIONS:
        for agp in (False, True):
            assert mine.apply_chat_template(conv, add_generation_prompt=agp, tokenize=False) == (
                theirs.apply_chat_template(conv, add_generation_prompt=agp, tokenize=False)
            )


def _write_dir(tmp_path, src_dir, config_update, extra_files=None, drop=()):
    d = tmp_path
    for name in ("tokenizer.json",):
        (d / name).write_bytes((src_dir / name).read_bytes())
    cfg = json.loads((src_dir / "tokenizer_config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(config_update)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    for name, text in (extra_files or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d


def test_dir_special_token_dicts_and_add_bos(saved_dir, tmp_path):
    from vllmx.tokenizer import Tokenizer

    d = _write_dir(
        tmp_path,
        saved_dir,
        {
            "bos_token": {"content": "<|im_start|>", "lstrip": False, "rstrip": False, "normalized": False,
                          "single_word": False, "special": True, "__type": "AddedToken"},
            "eos_token": "<|im_end|>",
            "add_bos_token": True,
        },
    )
    t = Tokenizer.from_pretrained_dir(d)
    assert t.bos_token_id == 1 and t.eos_token_id == 2
    ids = t.encode("hello")
    assert ids[0] == 1 and ids[1:] == t.encode("hello", add_special_tokens=False)
    # a post-processor that already adds BOS is not doubled
    d2 = tmp_path / "again"
    d2.mkdir()
    t.backend_tokenizer.save(str(d2 / "tokenizer.json"))
    (d2 / "tokenizer_config.json").write_text((d / "tokenizer_config.json").read_text())
    assert Tokenizer.from_pretrained_dir(d2).encode("hello") == ids


def test_dir_chat_template_sources(saved_dir, tmp_path):
    from vllmx.tokenizer import Tokenizer

    conv = [{"role": "user", "content": "x"}]
    # named templates in tokenizer_config (list form)
    d = _write_dir(
        tmp_path / "a",
        saved_dir,
        {"chat_template": [{"name": "default", "template": "D{{ messages[0]['content'] }}"},
                           {"name": "tool_use", "template": "T{{ tools | length }}"}]},
    ) if (tmp_path / "a").mkdir() is None else None
    for f in ("chat_template.jinja",):
        if (d / f).exists():
            (d / f).unlink()
    t = Tokenizer.from_pretrained_dir(d)
    assert isinstance(t.chat_template, dict)
    assert t.apply_chat_template(conv, tokenize=False) == "Dx"
    assert t.apply_chat_template(conv, tokenize=False, tools=[{"name": "f"}]) == "T1"
    assert t.apply_chat_template(conv, tokenize=False, chat_template="tool_use", tools=[]) == "T0"
    # chat_template.jinja wins over the config entry
    (tmp_path / "b").mkdir()
    d = _write_dir(tmp_path / "b", saved_dir, {"chat_template": "config"},
                   {"chat_template.jinja": "jinja{{ messages|length }}"})
    assert Tokenizer.from_pretrained_dir(d).apply_chat_template(conv, tokenize=False) == "jinja1"
    # chat_template.json as a fallback
    (tmp_path / "c").mkdir()
    d = _write_dir(tmp_path / "c", saved_dir, {}, {"chat_template.json": json.dumps({"chat_template": "json!"})},
                   drop=("chat_template",))
    assert Tokenizer.from_pretrained_dir(d).chat_template == "json!"


def test_dir_without_tokenizer_json(tmp_path):
    from vllmx.tokenizer import Tokenizer

    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_pretrained_dir(tmp_path)
