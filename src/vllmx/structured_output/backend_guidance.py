"""llguidance as the grammar engine (vLLM's "guidance" backend): a request's
StructuredOutputsParams into an llguidance grammar, and one matcher per request that follows its
tokens and gives the mask of the tokens that may come next."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Collection

import llguidance
import numpy as np

from vllmx.sampling_params import StructuredOutputsParams

logger = logging.getLogger("vllmx")

# What an error calls each constraint (a 400's message).
_KINDS = {"json": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
          "json_object": "json_object", "structural_tag": "structural_tag"}
# Keywords whose value maps names to subschemas / holds subschemas (where objects may nest).
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("additionalProperties", "items", "prefixItems", "contains", "allOf", "anyOf",
               "oneOf", "not", "if", "then", "else")


def _close_objects(schema):
    """disable_additional_properties: every object schema that lists properties and says
    nothing of others gets additionalProperties false (in place)."""
    if isinstance(schema, list):
        for s in schema:
            _close_objects(s)
        return
    if not isinstance(schema, dict):
        return
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for sub in schema[key].values():
                _close_objects(sub)
    for key in _SUBSCHEMAS:
        if isinstance(schema.get(key), (dict, list)):
            _close_objects(schema[key])
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        schema["additionalProperties"] = False


def _schema(schema, so: StructuredOutputsParams, what: str) -> dict | bool:
    """The schema as an object (parsed from its JSON text), objects closed where asked."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(  # noqa: TRY004 - bad request input: a 400, as in vLLM
            f"{what} must be a JSON schema object, got {type(schema).__name__}")
    if so.disable_additional_properties:
        schema = copy.deepcopy(schema)
        _close_objects(schema)
    return schema


def _json_grammar(schema, so: StructuredOutputsParams, what: str) -> str:
    schema = _schema(schema, so, what)
    options: dict = {"whitespace_flexible": not so.disable_any_whitespace}
    if so.whitespace_pattern is not None:
        options["whitespace_pattern"] = so.whitespace_pattern
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)


def _structural_tag_grammar(so: StructuredOutputsParams) -> str:
    """vLLM's structural tag: free text in which each trigger starts one of the structures
    (begin, a JSON schema, end)."""
    try:
        tag = json.loads(so.structural_tag)
        triggers = list(tag["triggers"])
        tags = []
        for i, s in enumerate(tag["structures"]):
            trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
            if trigger is None:
                raise ValueError(f"structure {i}: begin {s['begin']!r} starts with none of the "
                                 f"triggers {triggers}")
            tags.append(llguidance.StructTag(
                trigger=trigger, begin=s["begin"], end=s["end"],
                grammar=_schema(s["schema"], so, f"structural_tag structure {i} schema")))
    except (json.JSONDecodeError, KeyError, TypeError, AssertionError) as e:
        raise ValueError(f"structural_tag must be JSON with 'triggers' and 'structures' "
                         f"[{{'begin', 'schema', 'end'}}]: {type(e).__name__}: {e}") from None
    if not tags:
        raise ValueError("structural_tag has no structures")
    return llguidance.StructTag.to_grammar(tags)


def serialize_guidance_grammar(so: StructuredOutputsParams) -> str:
    """The llguidance grammar of a constraint (not yet checked: validate_grammar does that)."""
    if so.json is not None:
        return _json_grammar(so.json, so, "structured_outputs.json")
    if so.json_object:
        return _json_grammar({"type": "object"}, so, "json_object")
    if so.regex is not None:
        return llguidance.grammar_from("regex", so.regex)
    if so.choice is not None:
        return llguidance.grammar_from("choice", so.choice)
    if so.grammar is not None:  # Lark, or GBNF / EBNF (converted to Lark)
        return llguidance.grammar_from("grammar", so.grammar)
    return _structural_tag_grammar(so)


def compile_guidance_grammar(so: StructuredOutputsParams,
                             tokenizer: llguidance.LLTokenizer) -> llguidance.LLMatcher:
    """A fresh matcher for a constraint; ValueError naming the constraint and llguidance's
    message when it is not valid. Errors stay one line (no parser state dumps) for the
    tokens a matcher later rejects."""
    kind = next(label for name, label in _KINDS.items() if getattr(so, name) is not None)
    try:
        grammar = serialize_guidance_grammar(so)
    except ValueError as e:
        raise ValueError(f"Invalid {kind} for structured output: {e}") from None
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0,
                                   limits=llguidance.LLParserLimits(verbose_errors=False))
    if matcher.is_error():
        raise ValueError(f"Invalid {kind} for structured output: {matcher.get_error().strip()}")
    for w in matcher.get_grammar_warnings():
        logger.warning("structured output %s: %s", kind, w)
    return matcher


class GuidanceGrammar:
    """One request's matcher: the tokens it has accepted, the mask of the next token (EOS only
    where the grammar is complete), and whether it has ended."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: list[int],
                 lexer: int = 0):
        self.matcher = matcher
        self.eos_token_ids = set(eos_token_ids)
        self.lexer = lexer  # which compiled matcher it copies (its copies share a lock)
        self.terminated = False  # an EOS was accepted: the grammar is done
        self.active = True  # constraining now (a reasoning-gated one waits: reasoning_gate.py)

    @property
    def error(self) -> str:
        return self.matcher.get_error()

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advances over the request's new tokens; False when the grammar rejects one (then
        the matcher is in an error state and stays there)."""
        for t in tokens:
            if self.terminated:
                return True  # past the end (ignore_eos): only EOS follows, nothing to match
            if t in self.eos_token_ids and self.matcher.is_accepting():
                self.terminated = True
            if not self.matcher.consume_token(t):
                return False
        return True

    def fast_forward(self, limit: int, stop_ids: Collection[int] = ()) -> list[int]:
        """The tokens the grammar forces next, at most `limit`, consumed: the model runner
        appends them to the request's output without sampling them. llguidance's
        compute_ff_tokens proposes them (the forced bytes, tokenized canonically); each is
        kept only while the mask at its position allows it alone, the one token any sampling
        would pick (a forced byte run may also be spelled by other tokens, which the model
        could prefer). Never EOS nor one of stop_ids (a request's stop_token_ids: their
        sampling decides stop, ignore_eos and min_tokens as usual), nothing past the end."""
        if self.terminated or limit <= 0:
            return []
        forced = []
        for t in self.matcher.compute_ff_tokens()[:limit]:
            mask = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint32)
            if (t in self.eos_token_ids or t in stop_ids or int(np.bitwise_count(mask).sum()) != 1
                    or not (int(mask[t >> 5]) >> (t & 31)) & 1):
                break
            if not self.matcher.consume_token(t):
                raise RuntimeError(f"structured output: the grammar rejected its own forced "
                                   f"token {t} ({self.error})")
            forced.append(t)
        return forced

    def copy(self) -> GuidanceGrammar:
        """A matcher of its own in this one's state (llguidance's deep_copy, ~1 us): what the
        drafts of a verify step are consumed by, since rolling a matcher back fails where a
        draft ended a lexeme at its max_tokens (the matcher is then in an error state)."""
        other = GuidanceGrammar(self.matcher.deep_copy(), self.eos_token_ids, self.lexer)
        other.terminated = self.terminated
        return other

    def draft_prefix(self, drafts: list[int]) -> int:
        """How many of speculative decoding's drafts, in order, the grammar allows from here
        (they are cut there): none once terminated, none from an EOS on (its sampling decides
        the stop). Consumed by a copy, not validate_tokens, which over several tokens may pass a
        lexeme's max_tokens (llguidance says so) that consuming enforces."""
        n = next((i for i, t in enumerate(drafts) if t in self.eos_token_ids), len(drafts))
        if self.terminated or n == 0:
            return 0
        return self.matcher.deep_copy().try_consume_tokens(list(drafts[:n]))

    def allows(self, token: int) -> bool | None:
        """Whether fill_bitmask's mask would have `token`'s bit, told without computing the
        mask (~3 us against 30-300 us): llguidance's validate_tokens walks the token's bytes.
        None where only the mask can tell: where the grammar forces bytes next, the mask keeps
        their canonical tokens alone (a forced key `name` allows the token `name`, not `n` or
        `na`), which validate_tokens does not. validate_tokens also says no to EOS where the
        mask allows it (the grammar complete or stopped): EOS is decided by the matcher's
        state, as the mask decides it. (tests/structured_output: every token of the vocabulary
        against the mask, at every state of texts of each kind of constraint.)"""
        if self.terminated:
            return token in self.eos_token_ids
        if self.matcher.compute_ff_bytes():
            return None
        if token in self.eos_token_ids:
            return self.matcher.is_accepting() or self.matcher.is_stopped()
        return self.matcher.validate_tokens([token]) == 1

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Row `row` of bitmask (int32 [R, ceil(V / 32)]) = the tokens allowed next (only EOS
        once the grammar is complete or stopped)."""
        v = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(v.ctypes.data, v.nbytes)
