"""SamplingParams: vLLM's fields, defaults, normalisation and validation messages."""

from __future__ import annotations

import dataclasses

import pytest

from vllmx import SamplingParams
from vllmx.sampling_params import RequestOutputKind, SamplingType, StructuredOutputsParams


def test_defaults_match_vllm():
    sp = SamplingParams()
    expect = dict(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                  temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[],
                  stop_token_ids=[], bad_words=[], include_stop_str_in_output=False,
                  ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None,
                  prompt_logprobs=None, detokenize=True, skip_special_tokens=True,
                  spaces_between_special_tokens=True, truncate_prompt_tokens=None,
                  output_kind=RequestOutputKind.CUMULATIVE, logit_bias=None,
                  allowed_token_ids=None, skip_reading_prefix_cache=False)
    assert {k: getattr(sp, k) for k in expect} == expect
    assert sp.sampling_type == SamplingType.RANDOM and not sp.has_penalties


def test_normalisation():
    sp = SamplingParams(stop="x", stop_token_ids=[3, 3, 4], bad_words=["a", "a", "b"],
                        top_k=-1, seed=-1, logprobs=True, prompt_logprobs=True)
    assert sp.stop == ["x"] and sp.stop_token_ids == [3, 4] and sp.bad_words == ["a", "b"]
    assert sp.top_k == 0 and sp.seed is None and sp.logprobs == 1 and sp.prompt_logprobs == 1
    assert sp.skip_reading_prefix_cache  # prompt logprobs need every position computed
    g = SamplingParams(temperature=0, top_p=0.5, top_k=5, min_p=0.2)
    assert (g.top_p, g.top_k, g.min_p) == (1.0, 0, 0.0) and g.sampling_type == SamplingType.GREEDY
    assert SamplingParams(temperature=0.001).temperature == 0.01  # vLLM's floor
    assert SamplingParams(seed=3).sampling_type == SamplingType.RANDOM_SEED
    assert SamplingParams(repetition_penalty=1.1).has_penalties
    assert SamplingParams(logprobs=-1).logprobs == -1


def test_logit_bias_keys_and_clamping():
    sp = SamplingParams(logit_bias={"5": 200, 7: -1e9, 9: 1.5})
    assert sp.logit_bias == {5: 100.0, 7: -100.0, 9: 1.5}
    with pytest.raises(ValueError, match="logit_bias contains key.*cannot be converted.*'x'"):
        SamplingParams(logit_bias={"x": 1.0})


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=0), r"n must be at least 1, got 0\."),
    (dict(n=1.5), "n must be an int"),
    (dict(n=2, temperature=0), r"n must be 1 when using greedy sampling, got 2\."),
    (dict(best_of=2), "best_of is not supported"),
    (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\], got 2\.5\."),
    (dict(presence_penalty=-2.5), r"presence_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty=-3.0), r"frequency_penalty must be in \[-2, 2\], got -3\.0\."),
    (dict(repetition_penalty=0.0), r"repetition_penalty must be greater than zero, got 0\.0\."),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number"),
    (dict(temperature=-1), r"temperature must be non-negative, got -1\."),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(top_p=0), r"top_p must be in \(0, 1\], got 0\."),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), r"top_k must be 0 \(disable\), or at least 1, got -2\."),
    (dict(top_k=2.5), "top_k must be an integer, got float"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\], got 1\.5\."),
    (dict(max_tokens=0), r"max_tokens must be at least 1, got 0\."),
    (dict(min_tokens=-1), r"min_tokens must be greater than or equal to 0, got -1\."),
    (dict(min_tokens=20, max_tokens=10),
     r"min_tokens must be less than or equal to max_tokens=10, got 20\."),
    (dict(logprobs=-2), r"logprobs must be non-negative or -1, got -2\."),
    (dict(prompt_logprobs=-5), r"prompt_logprobs must be non-negative or -1, got -5\."),
    (dict(stop_token_ids=[1, "2"]), "stop_token_ids must contain only integers"),
    (dict(stop=["a", ""]), "stop cannot contain an empty string."),
    (dict(stop=["a"], detokenize=False), "stop strings are only supported when detokenize"),
    (dict(bad_words=["ok", ""]), "bad_words cannot contain an empty string"),
    (dict(allowed_token_ids=[]), "allowed_token_ids is not None and empty!"),
    (dict(allowed_token_ids=[1, "a"]), "allowed_token_ids must contain only integers"),
])
def test_validation_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


BIG = 2**70  # a valid JSON number past int64 (and float32 when it is a float)


@pytest.mark.parametrize("kwargs, match", [
    # What the native sampler cannot hold (int32 counts, float32 scales, int64 seeds) is a
    # ValueError naming the field and its range, never an error inside the engine step.
    (dict(temperature=1.7e308), r"temperature must be at most 3\.402823e\+38"),
    (dict(temperature=10**400), "temperature must be a finite number"),
    (dict(repetition_penalty=1.7e308), r"repetition_penalty must be in \[.*\] \(a float32\)"),
    (dict(repetition_penalty=1e-300), r"repetition_penalty must be in \["),
    (dict(top_p=1e-300), r"top_p must be in \(0, 1\]"),
    (dict(presence_penalty=float("nan")), "presence_penalty must be a finite number"),
    (dict(min_p="0.1"), "min_p must be a number, got str"),
    (dict(max_tokens=BIG), r"max_tokens must be at most 2147483647"),
    (dict(min_tokens=BIG), "min_tokens must be greater than or equal to 0"),
    (dict(logprobs=BIG), "logprobs must be non-negative or -1"),
    (dict(seed=BIG), r"seed must be in \[-9223372036854775808, 9223372036854775807\]"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(n=BIG), "n must be at least 1"),
    (dict(truncate_prompt_tokens=BIG), "truncate_prompt_tokens must be at most"),
    (dict(logit_bias={1: float("nan")}), r"logit_bias\[1\] must be a finite number"),
    (dict(logit_bias={float("inf"): 1}), "logit_bias contains key"),
    (dict(stop=[1]), "stop must be a string or a list of strings"),
])
def test_native_range_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_top_k_past_the_vocabulary_means_no_top_k():
    assert SamplingParams(top_k=BIG).top_k == 0  # past any vocabulary
    sp = SamplingParams(top_k=50)
    sp.verify_token_ids(50)
    assert sp.top_k == 0  # the whole vocabulary (vLLM's rule)
    sp = SamplingParams(top_k=49)
    sp.verify_token_ids(50)
    assert sp.top_k == 49


def test_structured_outputs_params():
    """vLLM's StructuredOutputsParams: exactly one constraint, each of its type; a dict (a
    request's object) and guided_decoding (the older name) become one."""
    sp = SamplingParams(structured_outputs={"json": {"type": "object"}})
    assert isinstance(sp.structured_outputs, StructuredOutputsParams)
    assert sp.structured_outputs.json == {"type": "object"}
    sp = SamplingParams(guided_decoding=StructuredOutputsParams(regex="a+"))
    assert sp.structured_outputs.regex == "a+" and sp.guided_decoding is None
    assert StructuredOutputsParams(choice=("a", "b")).choice == ["a", "b"]
    with pytest.raises(ValueError, match="only use one kind .* json, regex"):
        StructuredOutputsParams(json="{}", regex="a")
    with pytest.raises(ValueError, match="must use one kind"):
        StructuredOutputsParams(disable_any_whitespace=True)
    with pytest.raises(ValueError, match="choice must be a non-empty list of strings"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="choice must be a non-empty list of strings"):
        StructuredOutputsParams(choice=["a", 1])
    with pytest.raises(ValueError, match="json must be a JSON schema"):
        StructuredOutputsParams(json=3)
    with pytest.raises(ValueError, match="unknown field.*'jsn'"):
        SamplingParams(structured_outputs={"jsn": {}})
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(structured_outputs={"regex": "a"}, guided_decoding={"regex": "b"})


def test_not_supported_and_unknown():
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        SamplingParams(temprature=0.5)
    assert SamplingParams(n=2, best_of=2).n == 2  # best_of == n is a no-op


def test_verify_token_ids():
    ok = SamplingParams(stop_token_ids=[0, 9], logit_bias={9: 1}, allowed_token_ids=[0, 9],
                        logprobs=10, prompt_logprobs=-1)
    ok.verify_token_ids(10)
    cases = [
        (dict(stop_token_ids=[3, 10]), r"token_id\(s\) \[10\] in stop_token_ids"),
        (dict(logit_bias={-1: 2.0}), r"token_id\(s\) \[-1\] in logit_bias"),
        (dict(allowed_token_ids=[1, 12]), r"allowed_token_ids contains out-of-vocab token id!.*12"),
        (dict(_bad_words_token_ids=[[1, 11]]), r"specified as bad: \[11\]"),
        (dict(logprobs=11), "Requested sample logprobs of 11, which is greater than max allowed"),
        (dict(prompt_logprobs=11), "Requested prompt logprobs of 11"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**kwargs).verify_token_ids(10)


class WordTokenizer:
    """Each space-separated word is one token; a leading space makes it a different token
    (like BPE's 'Ġ' forms); 'xy' is two tokens."""

    def encode(self, text, add_special_tokens=True):
        out = []
        for i, w in enumerate(text.split(" ")):
            if not w:
                continue
            space = text.startswith(" ") or i > 0
            if w == "xy":
                out += [50 + space, 60]
            else:
                out.append(hash(w) % 40 + (40 if space else 0))
        return out


def test_update_from_tokenizer():
    sp = SamplingParams(bad_words=["foo", " xy"])
    sp.update_from_tokenizer(WordTokenizer())
    tok = WordTokenizer()
    foo, sfoo = tok.encode("foo"), tok.encode(" foo")
    assert sp.bad_words_token_ids == [foo, sfoo, [50, 60], [51, 60]]
    # replace() (used for n > 1 children and FINAL_ONLY copies) keeps the tokenized form
    assert dataclasses.replace(sp, seed=3).bad_words_token_ids == sp.bad_words_token_ids
    assert SamplingParams().bad_words_token_ids is None
    SamplingParams().update_from_tokenizer(tok)  # no bad words: nothing to do

    class Empty:
        def encode(self, text, add_special_tokens=True):
            return []

    with pytest.raises(ValueError, match="bad_words entries must tokenize to at least one"):
        SamplingParams(bad_words=["zz"]).update_from_tokenizer(Empty())
