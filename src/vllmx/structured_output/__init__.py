"""Structured outputs (vLLM's v1/structured_output): requests constrained by a JSON schema, a
regex, a choice, a grammar or a structural tag. The manager holds llguidance's view of the
tokenizer, checks each request's constraint before it is queued (a bad one is a ValueError:
HTTP 400), makes the model runner one matcher per constrained request, and fills the batch's
token bitmask on the host each step; the sampler applies it (ops.apply_token_bitmask) before
sampling. (On the CPU a greedy row without logprobs is sampled unmasked and its token checked
instead; the mask only where the grammar refuses it: StructuredOutputModelRunnerMixin.) With
speculative decoding a constrained request's drafts are cut where its grammar stops allowing
them, and each verify row is masked (or checked) at the grammar's state after the drafts
before it; the tokens a grammar forces after a step's are fast-forwarded by the model runner
(GuidanceGrammar.fast_forward; worker/structured_output_runner_mixin.py)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from vllmx.config import StructuredOutputsConfig
from vllmx.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from vllmx.structured_output.backend_guidance import GuidanceGrammar

__all__ = ["StructuredOutputManager", "StructuredOutputsParams"]

_MAX_COMPILED = 256  # constraints whose compiled matchers are kept


def mask_slices() -> list[str]:
    """llguidance's token slices (its docs/optimizations.md): where the lexer allows every
    token of a slice, that slice's tokens join the mask at once instead of by a walk of their
    trie. Its general slices cover JSON strings; these first claim the tokens of lowercase
    words and spaces, then of letters, digits and spaces (up to 10, then 30 bytes), which
    free text under a character-class regex allows too. The masks are the same (checked
    against the general slices in tests/structured_output); measured on SmolLM2's 49k
    vocabulary, one mask on one core (2026-12-06): `[a-z ]{600}` 0.21 -> 0.010 ms,
    `[a-zA-Z0-9 ,.]{1,400}` 0.30 -> 0.014 ms, a JSON schema, a Lark grammar, digits, dates
    and enums unchanged; building the tokenizer 1.4 -> 1.6 s for Gemma 3's 262k."""
    import llguidance

    general = llguidance.LLTokenizer.general_slices()
    whitespace, rest = general[0], general[1:]
    return [whitespace, "[a-z ]{1,10}", "[a-z ]{1,30}", "[a-zA-Z0-9 ]{1,10}",
            "[a-zA-Z0-9 ]{1,30}", *rest]


def mask_threads() -> int:
    """llguidance's threads for a batch's masks: its own default, 80% of the CPUs, up to 32."""
    return max(1, min(32, (os.cpu_count() or 1) * 4 // 5))

logger = logging.getLogger("vllmx")


class StructuredOutputManager:
    """tokenizer: vllmx's Tokenizer (its `tokenizers` JSON is what llguidance reads, for
    checkpoints and GGUF vocabularies alike); vocab_size: the model's logits width;
    eos_token_ids: the ids that end a request (the grammar allows them once it is complete);
    config: the engine's defaults (--structured-outputs-config)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int],
                 config: StructuredOutputsConfig | None = None):
        self.tokenizer = tokenizer
        self.config = config or StructuredOutputsConfig()
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._ll_tokenizer = None
        self._vocab_bytes: frozenset[int] | None = None  # every byte some token holds
        self._executor = None
        self._mask_thread: ThreadPoolExecutor | None = None  # grammar_bitmask_async's
        self._lock = threading.Lock()  # requests are checked on several threads
        # LRU of each constraint's start-state matchers, up to mask_threads() compiled copies:
        # llguidance's copies of one compiled matcher (deep_copy) share its lexer behind one
        # lock, so their masks are computed one at a time however many threads llguidance has
        # (32 rows of [a-z ]{600}: 7 ms on 1 or 2 threads alike; 32 separately compiled
        # matchers 3.6 ms on 2). A request copies the next of them in turn (each compiles in
        # ~0.5 ms), and grammar_bitmask hands llguidance the rows grouped by the one they
        # copied: its threads take contiguous runs of rows, which then hold different locks
        # (rows alternating between two compiled matchers ran no faster than one).
        self._compiled: OrderedDict[str, tuple[list, itertools.count]] = OrderedDict()
        # vLLM's reasoning_parser: constraints start after the reasoning (unless
        # enable_in_reasoning), found by the parser's end marker in token ids.
        self.reasoner = None
        if self.config.reasoning_parser and not self.config.enable_in_reasoning:
            from vllmx.reasoning import get_reasoning_parser

            self.reasoner = get_reasoning_parser(self.config.reasoning_parser)(tokenizer)

    @property
    def ll_tokenizer(self):
        """llguidance's tokenizer, built at the first constrained request (about a second for
        a 262k vocabulary). llguidance is imported only then: an engine without constrained
        requests runs without it."""
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance

                if not self.eos_token_ids:
                    raise ValueError("structured outputs need an EOS token id (the model and "
                                     "tokenizer name none)")
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self.tokenizer.backend_tokenizer.to_str(),
                    n_vocab=max(self.vocab_size, self.tokenizer.vocab_size),
                    eos_token=self.eos_token_ids, slices=mask_slices())
                self._executor = llguidance.LLExecutor(mask_threads())
            return self._ll_tokenizer

    def warm_up_async(self) -> None:
        """Builds llguidance's tokenizer in a background thread now (the server does, at
        start-up): its construction holds the GIL for 0.1 s (49k vocabulary) to 2.5 s (262k),
        which would otherwise stall every request in flight at the first constrained one."""
        def build():
            try:
                self.ll_tokenizer  # noqa: B018 - built and kept by the property
            except Exception as e:  # noqa: BLE001 - reported again at the first use
                logger.warning("structured outputs are unavailable: %s: %s",
                               type(e).__name__, e)

        threading.Thread(target=build, name="vllmx-llguidance-tokenizer", daemon=True).start()

    def _with_defaults(self, so: StructuredOutputsParams) -> StructuredOutputsParams:
        """The request's options, or the engine's where it does not set them."""
        c = self.config
        if not (c.disable_any_whitespace or c.disable_additional_properties):
            return so
        return dataclasses.replace(
            so, disable_any_whitespace=so.disable_any_whitespace or c.disable_any_whitespace,
            disable_additional_properties=(so.disable_additional_properties
                                           or c.disable_additional_properties))

    def _prototype(self, so: StructuredOutputsParams, next_copy: bool = False):
        """A compiled matcher of the constraint in its start state and its index among the
        constraint's (ValueError when it is not valid), kept for the next requests with the
        same constraint (a JSON schema sent with every request of an app compiles once per
        lexer: see _compiled). next_copy: the one the next request copies (compiled now when
        its turn comes first); else the first."""
        from vllmx.structured_output.backend_guidance import compile_guidance_grammar

        so = self._with_defaults(so)
        key = repr(so)
        with self._lock:
            if (entry := self._compiled.get(key)) is not None:
                self._compiled.move_to_end(key)
                pool, turns = entry
                turn = next(turns) % mask_threads() if next_copy else 0
                if turn < len(pool):
                    return pool[turn], turn
        matcher = compile_guidance_grammar(so, self.ll_tokenizer)  # (releases the GIL)
        with self._lock:
            if (entry := self._compiled.get(key)) is None:
                self._compiled[key] = ([matcher], itertools.count(1 if next_copy else 0))
                index = 0
            else:
                index = len(entry[0])
                if index < mask_threads():
                    entry[0].append(matcher)
            if len(self._compiled) > _MAX_COMPILED:
                self._compiled.popitem(last=False)
        return matcher, index

    def validate(self, so: StructuredOutputsParams) -> None:
        """Compiles the request's constraint (before it is queued, off the engine's step
        loop); ValueError naming what is wrong with it."""
        self._prototype(so)
        self._check_choices_writable(so)

    def _check_choices_writable(self, so: StructuredOutputsParams) -> None:
        """ValueError for a choice with a byte no token of the vocabulary holds: the model
        could never write it (SmolLM2 has no token holding 0xF1, the lead byte of U+40000 to
        U+7FFFF), and llguidance then forces a token the grammar rejects mid-request."""
        if not so.choice:
            return
        if self._vocab_bytes is None:
            llt = self.ll_tokenizer
            self._vocab_bytes = frozenset(llt.decode_bytes(list(range(llt.vocab_size))))
        for choice in so.choice:
            missing = sorted(set(choice.encode()) - self._vocab_bytes)
            if missing:
                raise ValueError(f"structured_outputs choice {choice!r} cannot be written by "
                                 f"this model: no token of its vocabulary holds the byte"
                                 f"{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(f'0x{b:02X}' for b in missing)}")

    def grammar_init(self, so: StructuredOutputsParams,
                     prompt_token_ids: list[int] | None = None) -> GuidanceGrammar:
        """A fresh matcher for one request (the model runner's, per request): a copy of the
        compiled one; behind the reasoning where the engine has a reasoning parser and the
        prompt has not closed the reasoning already (a template with thinking off)."""
        from vllmx.structured_output.backend_guidance import GuidanceGrammar
        from vllmx.structured_output.reasoning_gate import ReasoningGatedGrammar

        prototype, lexer = self._prototype(so, next_copy=True)
        grammar = GuidanceGrammar(prototype.deep_copy(), self.eos_token_ids, lexer)
        if self.reasoner is None or self.reasoner.is_reasoning_end(prompt_token_ids or []):
            return grammar
        return ReasoningGatedGrammar(grammar, self.reasoner.end_token_ids)

    def grammar_bitmask(self, grammars: list[GuidanceGrammar],
                        drafts: list[list[int]] | None = None,
                        parallel: bool = True) -> np.ndarray:
        """int32 [rows, ceil(vocab_size / 32)]: the tokens each grammar allows next, and with
        drafts (speculative decoding's, one list per grammar, each allowed by it) one row more
        per draft: the tokens allowed after the drafts before it (consumed by copies of the
        matchers, which are left as they were). parallel: the rows on llguidance's threads
        (GIL released); else one after the other on this thread, for a CPU whose cores run the
        forward right after: llguidance's idle threads keep spinning for a while, and on 2
        cores the taped forward ran beside them ~1 ms a step slower than the rows took on one
        thread (SmolLM2, batch 32: a JSON schema's cost 11.5-12.5% in parallel, 1.2-4.4% in
        line; bench/structured_output_cpu.py)."""
        drafts = drafts or [[] for _ in grammars]
        words_ll = (self.ll_tokenizer.vocab_size + 31) // 32
        starts = np.cumsum([0] + [1 + len(d) for d in drafts])
        rows = int(starts[-1])
        mask = (np.zeros if rows > len(grammars) else np.empty)((rows, words_ll), np.int32)
        if len(grammars) == 1 or not parallel:
            for g, d, r in zip(grammars, drafts, starts.tolist()):
                g.fill_bitmask(mask, r)
                cur = g.copy() if d else g  # (drafts consumed by a copy: GuidanceGrammar.copy)
                for j, t in enumerate(d):
                    if not cur.matcher.consume_token(t):
                        raise RuntimeError(f"structured output: a draft the grammar allowed "
                                           f"was refused ({cur.error})")
                    cur.fill_bitmask(mask, r + 1 + j)
        elif grammars:
            # (grouped by the compiled matcher each copies, whose lock its copies share)
            entries = sorted(zip(grammars, drafts, starts.tolist()), key=lambda e: e[0].lexer)
            if plain := [(g.matcher, r) for g, d, r in entries if not d]:
                self._executor.unsafe_compute_mask_ptr(plain, mask.ctypes.data, 4 * words_ll,
                                                       rows)
            # (llguidance's drafted call refuses an empty draft list; copies again, since it
            # rolls its matchers back)
            if drafted := [(g.matcher.deep_copy(), r, list(d)) for g, d, r in entries if d]:
                self._executor.unsafe_compute_mask_ptr_with_draft_token(
                    drafted, mask.ctypes.data, 4 * words_ll, rows)
        words = (self.vocab_size + 31) // 32
        # A tokenizer larger than the logits: its extra ids cannot be sampled anyway.
        return mask if words == words_ll else np.ascontiguousarray(mask[:, :words])

    def grammar_bitmask_async(self, grammars: list[GuidanceGrammar],
                              drafts: list[list[int]] | None = None) -> Future:
        """grammar_bitmask(grammars, drafts) on llguidance's threads, started from a thread of
        the manager's: returns once they are computing, not when they are done (the GPU's
        model runner takes the Future's result only when it queues the step's sampling)."""
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="vllmx-grammar-masks")
        started = threading.Event()

        def compute():
            started.set()
            return self.grammar_bitmask(grammars, drafts)  # (llguidance releases the GIL)

        masks = self._mask_thread.submit(compute)
        # Until the thread is inside llguidance: a thread waiting for the GIL gets it only
        # when this one blocks or after the interpreter's 5 ms switch interval.
        started.wait()
        return masks
