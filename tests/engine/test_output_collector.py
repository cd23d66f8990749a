"""RequestOutputCollector: outputs the caller has not taken yet merge (DELTA) or are replaced
(CUMULATIVE), sample by sample, and nothing is lost or reordered across threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vllmx.engine.output_collector import RequestOutputCollector
from vllmx.outputs import CompletionOutput, Logprob, RequestOutput


def _out(index, text, ids, finished=False, logprobs=None, prompt_logprobs=None):
    fin = "length" if finished else None
    return RequestOutput("r", "p", [1, 2], prompt_logprobs,
                         [CompletionOutput(index, text, list(ids), -0.5 * len(ids),
                                           logprobs=logprobs, finish_reason=fin)],
                         finished=finished)


def test_delta_outputs_merge_per_sample_while_waiting():
    async def main():
        c = RequestOutputCollector(asyncio.get_running_loop(), aggregate=True)
        lp = [{7: Logprob(-0.1)}]
        c.put(_out(0, "a", [7], logprobs=lp, prompt_logprobs=[None, {2: Logprob(-1.0)}]))
        c.put(_out(1, "x", [9]))
        c.put(_out(0, "b", [8], logprobs=[{8: Logprob(-0.2)}]))
        c.put(_out(1, "y", [10], finished=True))
        got = await c.get()
        by = {o.index: o for o in got.outputs}
        assert (by[0].text, by[0].token_ids, by[0].finish_reason) == ("ab", [7, 8], None)
        assert [list(d) for d in by[0].logprobs] == [[7], [8]]
        assert (by[1].text, by[1].token_ids, by[1].finish_reason) == ("xy", [9, 10], "length")
        assert got.prompt_logprobs is not None and got.finished
        c.put(_out(0, "c", [11]))  # after a get, a fresh output
        assert (await c.get()).outputs[0].token_ids == [11]

    asyncio.run(main())


def test_cumulative_outputs_replace_and_errors_raise():
    async def main():
        c = RequestOutputCollector(asyncio.get_running_loop(), aggregate=False)
        c.put(_out(0, "a", [7]))
        c.put(_out(0, "ab", [7, 8]))
        got = await c.get()
        assert (got.outputs[0].text, got.outputs[0].token_ids) == ("ab", [7, 8])
        c.put(_out(0, "abc", [7, 8, 9]))
        c.put(RuntimeError("engine died"))
        c.put(_out(0, "abcd", [7, 8, 9, 10]))  # nothing after the error reaches the caller
        with pytest.raises(RuntimeError, match="engine died"):
            await c.get()

    asyncio.run(main())


def test_a_finished_output_outlives_a_later_error():
    """The engine may die after a request's last output was put but before it was taken:
    the request is still reported finished, with its tokens, not failed."""
    async def main():
        c = RequestOutputCollector(asyncio.get_running_loop(), aggregate=True)
        c.put(_out(0, "a", [7]))
        c.put(_out(0, "b", [8], finished=True))
        c.put(RuntimeError("engine died"))
        got = await c.get()
        assert got.finished and got.outputs[0].token_ids == [7, 8]
        assert got.outputs[0].finish_reason == "length"

    asyncio.run(main())


def test_tokens_from_another_thread_arrive_whole_and_in_order():
    """The engine thread puts 2,000 one-token deltas while the loop takes them at its own
    pace: the concatenation is every token once, in order, and the last output finishes."""
    n = 2000

    async def main():
        loop = asyncio.get_running_loop()
        c = RequestOutputCollector(loop, aggregate=True)

        def engine():
            for i in range(n):
                c.put(_out(0, f"{i},", [i], finished=i == n - 1))

        t = threading.Thread(target=engine)
        t.start()
        ids, text, gets = [], "", 0
        while True:
            out = await c.get()
            gets += 1
            ids += out.outputs[0].token_ids
            text += out.outputs[0].text
            if out.finished:
                break
            if gets % 7 == 0:
                await asyncio.sleep(0.001)  # a slow consumer: outputs pile up and merge
        t.join()
        assert ids == list(range(n))
        assert text == "".join(f"{i}," for i in range(n))
        assert gets < n  # some outputs were merged

    asyncio.run(main())
