"""Which runner a checkpoint gets (vLLM's --runner / --convert), the sentence-transformers
pooling config, and the default pooling model."""

from __future__ import annotations

import json

import pytest

from vllmx.pooler_config import load_pooler_config, resolve_runner


@pytest.mark.parametrize(("archs", "runner", "convert", "want"), [
    (["LlamaForCausalLM"], "auto", "auto", ("generate", "none")),
    (["BertModel"], "auto", "auto", ("pooling", "embed")),
    (["XLMRobertaForSequenceClassification"], "auto", "auto", ("pooling", "classify")),
    (["Qwen3ForCausalLM"], "pooling", "auto", ("pooling", "embed")),
    (["Qwen3ForCausalLM"], "auto", "embed", ("pooling", "embed")),
    (["BertForMaskedLM"], "auto", "auto", ("pooling", "embed")),
    ([], "auto", "auto", ("generate", "none")),  # a GGUF file
    ([], "pooling", "auto", ("pooling", "embed")),
])
def test_resolve_runner(archs, runner, convert, want):
    assert resolve_runner(archs, runner, convert) == want


@pytest.mark.parametrize(("archs", "runner", "convert", "match"), [
    (["BertModel"], "generate", "auto", "cannot generate"),
    (["BertModel"], "auto", "classify", "classifier head"),
    (["LlamaForCausalLM"], "generate", "embed", "needs runner='pooling'"),
    (["LlamaForCausalLM"], "draft", "auto", "runner 'draft'"),
    (["LlamaForCausalLM"], "auto", "reward", "convert 'reward'"),
])
def test_resolve_runner_refuses(archs, runner, convert, match):
    with pytest.raises(ValueError, match=match):
        resolve_runner(archs, runner, convert)


def _st_dir(tmp_path, modules, pooling):
    tmp_path.mkdir()
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(tmp_path)


_MODULES = [{"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def test_sentence_transformers_pooling_configs(tmp_path):
    old = _st_dir(tmp_path / "a", [*_MODULES, {"path": "2_Normalize", "type": "x.Normalize"}],
                  {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    cfg = load_pooler_config(old)
    assert (cfg.pooling_type, cfg.normalize) == ("CLS", True)
    new = _st_dir(tmp_path / "b", _MODULES, {"pooling_mode": "lasttoken"})
    cfg = load_pooler_config(new)
    assert (cfg.pooling_type, cfg.normalize) == ("LAST", False)
    with pytest.raises(ValueError, match="max"):
        load_pooler_config(_st_dir(tmp_path / "c", _MODULES, {"pooling_mode": "max"}))
    with pytest.raises(ValueError, match="Dense"):
        load_pooler_config(_st_dir(tmp_path / "d", [*_MODULES, {"type": "x.Dense"}],
                                   {"pooling_mode": "mean"}))
    assert load_pooler_config(str(tmp_path)) is None  # no modules.json


def test_default_pooling_model_and_pooler_override(minilm_dir):
    from vllmx import LLM

    llm = LLM(runner="pooling")  # no model named: the built-in MiniLM
    assert llm.pooling_engine.config.model_config.path == minilm_dir
    cls = LLM(minilm_dir, pooler_config={"pooling_type": "CLS", "normalize": False})
    mean = llm.embed("hello world")[0].outputs.embedding
    first = cls.embed("hello world")[0].outputs.embedding
    assert abs(sum(x * x for x in mean) - 1) < 1e-5
    assert abs(sum(x * x for x in first) - 1) > 1e-3  # not normalized
    with pytest.raises(ValueError, match="pooling_type"):
        LLM(minilm_dir, pooler_config={"pooling_type": "MAX"})
