"""The scheduler step by step with hand-made runner outputs (no model): token budget, chunked
prefill, decode-first order, max_num_seqs, preemption order under FCFS and priority, admission
at a prefix hit, and rejection of requests that could never fit."""

from __future__ import annotations

import pytest

from vllmx.config import CacheConfig, SchedulerConfig
from vllmx.core.sched_output import ModelRunnerOutput, SchedulerOutput
from vllmx.core.scheduler import Scheduler
from vllmx.engine.request import Request, RequestStatus
from vllmx.sampling_params import SamplingParams

BS = 4


def make_sched(num_blocks=32, budget=64, max_num_seqs=8, max_model_len=64, policy="fcfs",
               caching=True) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs, budget, max_model_len, policy),
                     CacheConfig(block_size=BS, num_blocks=num_blocks,
                                 enable_prefix_caching=caching))


_next = iter(range(1, 10**6))


def make_req(rid: str, n: int = 0, tokens=None, max_tokens=100, priority=0, arrival=None):
    if tokens is None:  # distinct per request: no accidental prefix hits
        base = next(_next) * 1000
        tokens = [base + i for i in range(n)]
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, tokens, sp, arrival_time=arrival, priority=priority)


def step(s: Scheduler, token: int = 1) -> SchedulerOutput:
    """One schedule + a fake forward that samples `token` for requests that caught up."""
    so = s.schedule()
    sampled = {}
    for rid, n in so.num_scheduled_tokens.items():
        r = s.requests[rid]
        assert r.num_computed_tokens <= r.num_tokens + r.num_output_placeholders
        if r.num_output_placeholders:  # caught up: the step samples its next token
            sampled[rid] = [token]
    s.update_from_output(so, ModelRunnerOutput(list(so.num_scheduled_tokens), sampled,
                                               {r: [0.0] for r in sampled}))
    return so


def test_token_budget_splits_and_chunks_prefill():
    s = make_sched(budget=10)
    a, b = make_req("a", 8), make_req("b", 8)
    s.add_request(a)
    s.add_request(b)
    so = step(s)
    assert so.num_scheduled_tokens == {"a": 8, "b": 2}
    assert [n.req_id for n in so.scheduled_new_reqs] == ["a", "b"]
    assert a.num_output_tokens == 1 and b.num_output_tokens == 0 and b.num_computed_tokens == 2
    so = step(s)
    assert so.num_scheduled_tokens == {"a": 1, "b": 6}  # a's decode first, b's next chunk
    assert so.scheduled_cached_reqs.req_ids == ["a", "b"]
    assert so.scheduled_cached_reqs.num_computed_tokens == [8, 2]
    assert so.total_num_scheduled_tokens == 7 and b.num_output_tokens == 1
    assert step(s).num_scheduled_tokens == {"a": 1, "b": 1}


def test_decodes_go_before_new_prefills():
    s = make_sched(budget=4)
    s.add_request(make_req("a", 3))
    step(s)
    s.add_request(make_req("c", 10))
    so = step(s)
    assert list(so.num_scheduled_tokens.items()) == [("a", 1), ("c", 3)]
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0


def test_max_num_seqs():
    s = make_sched(max_num_seqs=2)
    for rid in "abc":
        s.add_request(make_req(rid, 5, max_tokens=1))
    so = step(s)
    assert set(so.num_scheduled_tokens) == {"a", "b"}  # both finish (max_tokens=1)
    assert s.get_num_unfinished_requests() == 1
    so = step(s)
    assert set(so.num_scheduled_tokens) == {"c"} and so.finished_req_ids == {"a", "b"}


def _three_running(s: Scheduler, **prio):
    reqs = [make_req(rid, 7, priority=prio.get(rid, 0)) for rid in "abc"]
    for r in reqs:
        s.add_request(r)
    step(s)  # prefill: 2 blocks each
    step(s)  # decode into the second block
    return reqs


def test_fcfs_preempts_the_newest_and_resumes_it_first():
    s = make_sched(num_blocks=6)
    _, _, c = _three_running(s)
    d = make_req("d", 3)
    s.add_request(d)
    so = step(s)  # a and b each need a third block: none free
    assert so.preempted_req_ids == {"c"} and set(so.num_scheduled_tokens) == {"a", "b"}
    assert not so.scheduled_new_reqs  # no admissions in a step that preempted
    assert c.status == RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert list(s.waiting) == [c, d] and s.num_preemptions == 1
    assert s.kv_cache_manager.num_free_blocks == 0


def test_priority_preempts_the_lowest_priority():
    s = make_sched(num_blocks=6, policy="priority")
    _, b, _ = _three_running(s, a=0, b=5, c=1)
    so = step(s)
    assert so.preempted_req_ids == {"b"}  # not c, the newest
    assert set(so.num_scheduled_tokens) == {"a", "c"}
    assert b.status == RequestStatus.PREEMPTED


def test_priority_victim_already_scheduled_this_step_is_undone():
    s = make_sched(num_blocks=4, policy="priority")
    a, b = make_req("a", 7, priority=5), make_req("b", 3, priority=0)
    s.add_request(a)
    s.add_request(b)
    step(s)
    step(s)  # a holds 2 blocks, b 1, one free
    so = step(s)  # a takes the last block; b then needs one: a (priority 5) is the victim
    assert so.preempted_req_ids == {"a"}
    assert so.num_scheduled_tokens == {"b": 1} and so.total_num_scheduled_tokens == 1
    assert so.scheduled_cached_reqs.req_ids == ["b"]
    assert len(so.scheduled_cached_reqs.new_block_ids) == 1
    assert s.kv_cache_manager.get_block_ids("a") == [] and a.num_computed_tokens == 0


def test_priority_waiting_order_and_ties_by_arrival():
    s = make_sched(max_num_seqs=1, policy="priority")
    reqs = [make_req(rid, 3, max_tokens=1, priority=p, arrival=t)
            for rid, p, t in [("p3", 3, 1.0), ("p1", 1, 2.0), ("p2late", 2, 4.0),
                              ("p2", 2, 3.0), ("p2tie", 2, 3.0)]]
    for r in reqs:
        s.add_request(r)
    order = [next(iter(step(s).num_scheduled_tokens)) for _ in reqs]
    assert order == ["p1", "p2", "p2tie", "p2late", "p3"]


def test_admission_starts_at_the_prefix_hit():
    s = make_sched()
    a = make_req("a", tokens=list(range(12)), max_tokens=1)
    s.add_request(a)
    a_blocks = step(s).scheduled_new_reqs[0].block_ids  # a finishes; its 3 blocks stay cached
    assert a.is_finished() and s.kv_cache_manager.num_free_blocks == 32
    b = make_req("b", tokens=list(range(8)) + [50, 51, 52])
    s.add_request(b)
    so = s.schedule()
    new = so.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 8 and b.num_computed_tokens == 8 + 3  # (hit + scheduled)
    assert new.block_ids[:2] == a_blocks[:2] and len(new.block_ids) == 3
    assert so.num_scheduled_tokens == {"b": 3} and b.num_cached_tokens == 8
    # The same prompt as a: all three blocks match, but the last token is recomputed.
    s2 = make_sched()
    for rid in ("x", "y"):
        s2.add_request(make_req(rid, tokens=list(range(12)), max_tokens=1))
        so = step(s2)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 8 and so.num_scheduled_tokens == {
        "y": 4}


def test_preempted_request_resumes_from_its_cached_blocks():
    s = make_sched(num_blocks=7)
    _, _, c = _three_running(s)  # 6 blocks in use, 1 free
    so = step(s)  # a takes the free block; b needs one: c is preempted, b reuses one of c's
    assert so.preempted_req_ids == {"c"}
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    so = s.schedule()
    resumed = [n for n in so.scheduled_new_reqs if n.req_id == "c"]
    assert resumed and resumed[0].num_computed_tokens == 4  # c's first block was still cached
    assert resumed[0].token_ids == c.all_token_ids and c.num_output_tokens == 2
    assert so.num_scheduled_tokens["c"] == 9 - 4
    assert c.num_cached_tokens == 0  # RequestOutput's: the hit at first admission
    assert s.kv_cache_manager.prefix_cache_stats.preempted_hits == 4


def test_never_fitting_requests_are_rejected():
    s = make_sched(num_blocks=4, max_model_len=0)  # 16 slots in all
    with pytest.raises(ValueError, match="needs 5 KV blocks.*only 4 blocks"):
        s.add_request(make_req("big", 16))
    s.add_request(make_req("fits", 15))
    s = make_sched(max_model_len=10)
    with pytest.raises(ValueError, match="max_model_len=10"):
        s.add_request(make_req("long", 10))
    with pytest.raises(ValueError, match="empty"):
        s.add_request(make_req("empty", tokens=[]))
    s.add_request(make_req("ok", 9))
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(make_req("ok", 3))
    assert s.get_num_unfinished_requests() == 1


def test_length_cap_at_max_model_len():
    s = make_sched(max_model_len=8)
    a = make_req("a", 6)
    s.add_request(a)
    step(s)
    step(s)
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED and a.num_tokens == 8


def test_finish_requests_frees_running_and_waiting():
    s = make_sched(max_num_seqs=1)
    a, b = make_req("a", 5), make_req("b", 5)
    s.add_request(a)
    s.add_request(b)
    step(s)
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished_requests() and s.kv_cache_manager.num_free_blocks == 32
    assert s.schedule().finished_req_ids == {"a", "b"}
    assert s.reset_prefix_cache() is True


def test_caching_off_schedules_from_zero():
    s = make_sched(caching=False)
    for rid in ("x", "y"):
        s.add_request(make_req(rid, tokens=list(range(12)), max_tokens=1))
        so = step(s)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0
    assert so.num_scheduled_tokens == {"y": 12}


def test_bad_policy():
    with pytest.raises(ValueError, match="policy"):
        make_sched(policy="lifo")
