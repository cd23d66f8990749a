"""llguidance as vllmx uses it, on SmolLM2's GGUF vocabulary: each constraint's grammar, its
check (ValueError naming llguidance's message), the matcher's masks (EOS only once the grammar is
complete), disable_additional_properties / disable_any_whitespace (per request, or the engine's
--structured-outputs-config), structural tags, and the batch's masks computed in parallel equal
to one at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.structured_output.schemas import PERSON, SEGMENT
from vllmx.config import StructuredOutputsConfig
from vllmx.sampling_params import StructuredOutputsParams as SO
from vllmx.structured_output import StructuredOutputManager
from vllmx.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    return Tokenizer.from_gguf_file(smollm2_gguf)


@pytest.fixture(scope="module")
def manager(tokenizer):
    return StructuredOutputManager(tokenizer, tokenizer.vocab_size, {tokenizer.eos_token_id})


def allowed(manager, grammar) -> set[int]:
    mask = manager.grammar_bitmask([grammar])[0].view(np.uint32)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:manager.vocab_size]
    return set(np.flatnonzero(bits).tolist())


def feed(manager, tokenizer, so: SO, text: str):
    """A matcher for so after the tokens of text (each one allowed by the mask before it)."""
    g = manager.grammar_init(so)
    for t in tokenizer.encode(text, add_special_tokens=False):
        assert t in allowed(manager, g), (text, tokenizer.decode([t]))
        assert g.accept_tokens([t])
    return g


def test_eos_only_when_the_grammar_is_complete(manager, tokenizer):
    eos = tokenizer.eos_token_id
    text = json.dumps({"name": "Ann", "age": 30, "address": {"city": "Oslo", "zip": "01234"}})
    g = manager.grammar_init(SO(json=PERSON))
    ids = tokenizer.encode(text, add_special_tokens=False)
    for t in ids[:-1]:
        assert eos not in allowed(manager, g)
        assert g.accept_tokens([t])
    assert g.accept_tokens(ids[-1:])
    assert allowed(manager, g) == {eos}  # the object is closed: nothing else may follow
    assert g.accept_tokens([eos]) and g.terminated
    assert g.accept_tokens([eos])  # ignore_eos: more EOS past the end is not an error


def test_a_rejected_token_is_an_error_state(manager, tokenizer):
    g = manager.grammar_init(SO(choice=["yes", "no"]))
    bad = tokenizer.encode("maybe", add_special_tokens=False)[0]
    assert bad not in allowed(manager, g)
    assert not g.accept_tokens([bad]) and g.error


@pytest.mark.parametrize("so,text", [
    (SO(regex=r"[0-9]{3}-[0-9]{4}"), "555-1234"),
    (SO(choice=["Paris", "New York City"]), "New York City"),
    (SO(grammar='start: "x=" NUM ";"\nNUM: /[0-9]+/'), "x=42;"),
    (SO(grammar='root ::= "x=" [0-9]+ ";"'), "x=42;"),  # GBNF
    (SO(json_object=True), '{"any": [1, 2, {"thing": null}]}'),
    (SO(json=json.dumps(SEGMENT)), '{"start": {"x": 1, "y": 2}, "end": {"x": -3, "y": 4}}'),
])
def test_each_kind_accepts_a_matching_text(manager, tokenizer, so, text):
    g = feed(manager, tokenizer, so, text)
    assert tokenizer.eos_token_id in allowed(manager, g)


def test_additional_properties_and_whitespace_options(manager, tokenizer):
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}},
                   "required": ["a"]}
    # Open by default (JSON Schema's rule): another key may follow a.
    g = feed(manager, tokenizer, SO(json=open_schema), '{"a": 1, "b"')
    assert not g.error
    closed = manager.grammar_init(SO(json=open_schema, disable_additional_properties=True))
    assert closed.accept_tokens(tokenizer.encode('{"a": 1', add_special_tokens=False))
    assert not closed.accept_tokens(tokenizer.encode(', "b"', add_special_tokens=False))
    flexible = allowed(manager, feed(manager, tokenizer, SO(json=open_schema), '{"a"'))
    tight = allowed(manager, feed(manager, tokenizer,
                                  SO(json=open_schema, disable_any_whitespace=True), '{"a"'))
    assert tight < flexible
    assert any(tokenizer.decode([t]) != tokenizer.decode([t]).strip() for t in flexible)
    assert all(tokenizer.decode([t]) == tokenizer.decode([t]).strip() for t in tight)


def test_structural_tag(manager, tokenizer):
    """Free text, where the trigger starts a tool call whose arguments follow the schema."""
    tag = json.dumps({"triggers": ["<function="], "structures": [{
        "begin": "<function=get_weather>", "end": "</function>",
        "schema": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}]})
    feed(manager, tokenizer, SO(structural_tag=tag),
         'Let me check. <function=get_weather>{"city": "Paris"}</function> Done.')
    g = manager.grammar_init(SO(structural_tag=tag))
    assert not g.accept_tokens(tokenizer.encode('<function=get_weather>{"town": 1}',
                                                add_special_tokens=False))


@pytest.mark.parametrize("so,words", [
    (SO(json={"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}),
     ["Invalid JSON schema", "/$defs/nope"]),
    (SO(json={"type": "strin"}), ["Invalid JSON schema", "strin"]),
    (SO(json="{bad"), ["Invalid JSON schema", "not valid JSON"]),
    (SO(json="[1, 2]"), ["Invalid JSON schema", "must be a JSON schema object"]),
    (SO(regex="(unclosed"), ["Invalid regex"]),
    (SO(grammar="start: missing"), ["Invalid grammar", "missing"]),
    (SO(grammar="root ::= ("), ["Invalid grammar"]),
    (SO(structural_tag="{}"), ["Invalid structural_tag", "triggers"]),
    # U+40000's lead byte 0xF1 is in no token of SmolLM2's vocabulary (a fuzzed request had
    # failed mid-generation with a 500): refused up front, naming the byte
    (SO(choice=["ok", "\U00040000"]), [r"choice '\U00040000' cannot be written", "0xF1"]),
])
def test_invalid_constraints_are_value_errors(manager, so, words):
    with pytest.raises(ValueError) as e:
        manager.validate(so)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_batch_masks_equal_single_masks(manager, tokenizer):
    kinds = [SO(json=PERSON), SO(regex="[a-z]+"), SO(choice=["alpha", "beta"]),
             SO(json_object=True)]
    grammars = [feed(manager, tokenizer, so, prefix) for so, prefix in
                zip(kinds, ['{"name": "Jo', "ab", "al", "{"])]
    batch = manager.grammar_bitmask(grammars)
    assert batch.shape == (4, (tokenizer.vocab_size + 31) // 32) and batch.dtype == np.int32
    for i, g in enumerate(grammars):
        np.testing.assert_array_equal(batch[i], manager.grammar_bitmask([g])[0])
    assert len({batch[i].tobytes() for i in range(4)}) == 4


def test_engine_config_sets_the_defaults(tokenizer, manager):
    """--structured-outputs-config's disable_any_whitespace applies to every request."""
    cfg = StructuredOutputsConfig.from_dict('{"backend": "guidance", '
                                            '"disable_any_whitespace": true}')
    tight = StructuredOutputManager(tokenizer, tokenizer.vocab_size, {tokenizer.eos_token_id},
                                    cfg)
    so = SO(json={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert (allowed(tight, feed(tight, tokenizer, so, '{"a"'))
            < allowed(manager, feed(manager, tokenizer, so, '{"a"')))
    assert so.disable_any_whitespace is False  # the request's own params are left alone


@pytest.mark.parametrize("cfg,words", [
    ({"backend": "xgrammar"}, ["vLLM backend vllmx does not run", "guidance"]),
    ({"backend": "fast"}, ["not a structured-output backend"]),
    ({"disable_any_whitespace": "yes"}, ["true or false"]),
    ({"reasoning_parser": "r1"}, ["invalid reasoning parser: 'r1'", "deepseek_r1"]),
    ({"whitespace": True}, ["keys ['whitespace'] are not supported"]),
    ("{oops", ["not valid JSON"]),
])
def test_engine_config_errors(cfg, words):
    with pytest.raises(ValueError) as e:
        StructuredOutputsConfig.from_dict(cfg)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_serve_flag_reaches_engine_args():
    import argparse

    from vllmx.cli.serve import add_serve_parser, engine_args_from

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--structured-outputs-config",
                              '{"disable_additional_properties": true}'])
    cfg = engine_args_from(args).create_engine_config().structured_outputs_config
    assert cfg.disable_additional_properties and cfg.backend == "auto"


def test_a_constraint_compiles_once_per_mask_thread(manager, tokenizer, monkeypatch):
    """Requests copy a constraint's compiled matchers in turn, one compiled per llguidance
    thread at most (copies of one share its lexer's lock), and each request its own copy."""
    import vllmx.structured_output as so_mod

    monkeypatch.setattr(so_mod, "mask_threads", lambda: 3)
    so = SO(regex="a[0-9]x")
    manager.validate(so)
    key = repr(so)
    assert len(manager._compiled[key][0]) == 1
    grammars = [manager.grammar_init(SO(regex="a[0-9]x")) for _ in range(7)]
    pool = manager._compiled[key][0]
    assert len(pool) == 3 and len({id(m) for m in pool}) == 3  # the checked one, then 2 more
    manager.validate(so)
    assert manager._compiled[key][0] == pool  # checking again compiles nothing
    assert len({id(g.matcher) for g in grammars}) == 7
    a, b = grammars[0], grammars[1]
    assert a.accept_tokens(tokenizer.encode("a1x", add_special_tokens=False))
    assert allowed(manager, a) == {tokenizer.eos_token_id}
    assert tokenizer.eos_token_id not in allowed(manager, b)  # b is still at the start
    assert [g.lexer for g in grammars] == [0, 1, 2, 0, 1, 2, 0]
    # Rows in different states, copies of 3 compiled matchers: the batch's masks (its rows
    # handed to llguidance grouped by lexer) are each row's own.
    for i, g in enumerate(grammars[1:], 1):
        assert g.accept_tokens(tokenizer.encode("a1x"[:i % 4], add_special_tokens=False))
    batch = manager.grammar_bitmask(grammars)
    assert len({row.tobytes() for row in batch}) == 4
    for i, g in enumerate(grammars):
        np.testing.assert_array_equal(batch[i], manager.grammar_bitmask([g])[0])


@pytest.mark.parametrize("so,text", [
    (SO(json=PERSON), '{"name": "Jo", "age": 41, "address": {"city": "Rome", "zip": "00100"}}'),
    (SO(json=PERSON, disable_any_whitespace=True),
     '{"name":"Jo","age":41,"address":{"city":"Rome","zip":"00100"}}'),
    (SO(json=json.dumps(SEGMENT)), '{"start": {"x": 1, "y": 2}, "end": {"x": -3, "y": 4}}'),
    (SO(json_object=True), '{"any": [1, 2, {"thing": null}]}'),
    (SO(regex="[a-z]+"), "abc"),  # complete after every letter: EOS and more letters
    (SO(regex="[a-z ]{12}"), "hello worlds"),
    (SO(regex=r"[0-9]{3}-[0-9]{4}"), "555-1234"),
    (SO(regex=r"The answer is (yes|no)\."), "The answer is no."),
    (SO(choice=["Paris", "New York City"]), "New York City"),
    (SO(grammar='start: "x=" NUM ";"\nNUM: /[0-9]+/'), "x=42;"),
])
def test_allows_is_the_masks_bit(manager, tokenizer, so, text):
    """GuidanceGrammar.allows(t) (a sampled token checked instead of a mask computed) says
    what the mask says, for every token of the vocabulary at every state along a text: its
    start, the middle, complete (EOS allowed), terminated by an EOS; or None (ask the mask),
    and then only where the grammar forces bytes (the mask a single canonical token or few)."""
    eos = tokenizer.eos_token_id
    g = manager.grammar_init(so)
    ids = tokenizer.encode(text, add_special_tokens=False)
    seen_eos = decided = 0
    for t in ids + [eos, None]:
        mask = allowed(manager, g)
        says = [g.allows(u) for u in range(manager.vocab_size)]
        if says[0] is None:
            assert all(x is None for x in says) and g.matcher.compute_ff_bytes()
        else:
            assert {u for u, x in enumerate(says) if x} == mask, (text, t)
            decided += 1
        seen_eos += eos in mask
        if t is not None:
            assert g.accept_tokens([t])
    assert g.terminated and seen_eos >= 2 and decided >= 2


def test_draft_prefix_and_masks_with_drafts(manager, tokenizer):
    """Speculative decoding's drafts: cut where the grammar stops allowing them (a refused
    token, an EOS, a terminated grammar); the masks of a grammar with drafts are those of its
    states after each draft prefix, in line and on llguidance's threads alike, and the
    matchers are left as they were."""
    eos = tokenizer.eos_token_id
    text = '{"name": "Jo", "age": 41, "address": {"city": "Rome", "zip": "00100"}}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    bad = tokenizer.encode("maybe", add_special_tokens=False)[0]
    g = manager.grammar_init(SO(json=PERSON))
    assert g.accept_tokens(ids[:4])
    rest = ids[4:]
    assert g.draft_prefix(rest[:5]) == 5
    assert g.draft_prefix(rest[:3] + [bad] + rest[3:5]) == 3
    assert g.draft_prefix([]) == 0
    before = allowed(manager, g)
    other = feed(manager, tokenizer, SO(regex="[a-z]+"), "ab")
    choice = manager.grammar_init(SO(choice=["alpha", "beta"]))
    grammars = [g, choice, other]
    drafts = [rest[:4], [], tokenizer.encode("cd", add_special_tokens=False)]
    inline = manager.grammar_bitmask(grammars, drafts, parallel=False)
    threads = manager.grammar_bitmask(grammars, drafts)
    assert inline.shape[0] == 4 + 1 + 1 + len(drafts[2]) + 1
    np.testing.assert_array_equal(inline, threads)
    assert allowed(manager, g) == before  # (rolled back)
    row = 0
    for grammar, d in zip(grammars, drafts):
        for j in range(len(d) + 1):
            np.testing.assert_array_equal(inline[row], manager.grammar_bitmask([grammar])[0])
            row += 1
            if j < len(d):
                assert grammar.accept_tokens([d[j]])
    done = feed(manager, tokenizer, SO(choice=["yes", "no"]), "yes")
    assert done.draft_prefix([eos, eos]) == 0  # (EOS drafts are never kept)
    assert done.accept_tokens([eos]) and done.terminated and done.draft_prefix([eos]) == 0
    # A lexeme's max_tokens, which validate_tokens over several tokens does not enforce: the
    # drafts stop there, and the masks with them are computed without a refused draft.
    limited = manager.grammar_init(SO(grammar='start: x "!"\nx[max_tokens=3]: /[a-z ]+/'))
    words = tokenizer.encode("the cat sat on the mat", add_special_tokens=False)
    assert limited.matcher.validate_tokens(words) > 3
    assert limited.draft_prefix(words) == 3 and limited.draft_prefix(words[:2] + [eos]) == 2
    cut = words[:limited.draft_prefix(words)]
    assert manager.grammar_bitmask([limited], [cut], parallel=False).shape[0] == 4
    assert limited.accept_tokens(cut)  # (the matcher was left where it was)


@pytest.mark.parametrize("kind,grammar,text", [
    ("regex", "[a-z ]{45}", "the quick brown fox jumps over the lazy dog a"),
    ("regex", "[a-zA-Z0-9 ]{1,25}", "Route 66 runs West to LA"),
    ("regex", "[a-z]+( [A-Z][a-z]*)*", "hello World Foo Bar"),
    ("json_schema", json.dumps({"type": "array", "items": {"type": "string", "maxLength": 12}}),
     '["short words", "a b c", "tiny"]'),
    ("json_schema", json.dumps(PERSON), '{"name": "Ann Lee", "age": 30, "address": '
                                        '{"city": "Oslo", "zip": "01234"}}'),
    ("lark", 'start: (NAME "=" NAME ";")+\nNAME: /[a-z ]{1,20}/', "some name=other words;x=y;"),
])
def test_slices_keep_the_masks(manager, tokenizer, kind, grammar, text):
    """vllmx's token slices (mask_slices) only spare trie walks: at every position of a text
    (past the bounds where a slice stops fitting the lexeme) the masks are those of
    llguidance's general slices."""
    import llguidance
    import llguidance.numpy as lnp

    general = llguidance.LLTokenizer(tokenizer.backend_tokenizer.to_str(),
                                     n_vocab=manager.ll_tokenizer.vocab_size,
                                     eos_token=tokenizer.eos_token_id)
    g = llguidance.grammar_from(kind, grammar)
    ours, theirs = (llguidance.LLMatcher(t, g) for t in (manager.ll_tokenizer, general))
    masks = lnp.allocate_token_bitmask(2, general.vocab_size)
    ids = tokenizer.encode(text, add_special_tokens=False)
    for i, t in enumerate(ids + [None]):
        lnp.fill_next_token_bitmask(ours, masks, 0)
        lnp.fill_next_token_bitmask(theirs, masks, 1)
        assert np.array_equal(masks[0], masks[1]), (kind, grammar, tokenizer.decode(ids[:i]))
        if t is not None:
            assert ours.consume_token(t) and theirs.consume_token(t), tokenizer.decode(ids[:i + 1])
    assert not ours.is_error() and np.count_nonzero(masks[0]) > 0
