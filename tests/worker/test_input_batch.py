"""The persistent input batch: rows kept across steps (tokens appended, blocks appended, holes
condensed, and for MLA models new prompts swapped to the end) give the same step inputs as
building every request's inputs from scratch."""
import numpy as np
import pytest

from vllmx.worker.input_batch import InputBatch

BS = 4


def naive(reqs, sched):
    """Each request's positions, input ids, slots and seq_len rebuilt from its lists."""
    ids, pos, slots, lens = [], [], [], []
    for (tokens, computed, blocks), n in zip(reqs, sched):
        p = np.arange(computed, computed + n)
        ids += [tokens[i] for i in p]
        pos += p.tolist()
        slots += [blocks[i // BS] * BS + i % BS for i in p]
        lens.append(computed + n)
    return ids, pos, slots, lens


@pytest.mark.parametrize("prompts_last", [False, True])
def test_steps_match_a_rebuild_from_scratch(prompts_last):
    rng = np.random.default_rng(0)
    batch = InputBatch(max_num_reqs=8, max_model_len=64, block_size=BS)
    live: dict[str, list] = {}  # req_id -> [tokens, num_computed, blocks]
    next_block, serial = 0, 0
    for _step in range(60):
        # finish some, add some, leave some out of this step
        for r in [r for r in live if rng.random() < 0.15]:
            del live[r]
            batch.remove_request(r)
        while len(live) < 6 and rng.random() < 0.7:
            r, serial = f"r{serial}", serial + 1
            toks = rng.integers(0, 1000, int(rng.integers(1, 20))).tolist()
            nblk = -(-len(toks) // BS)
            live[r] = [toks, 0, list(range(next_block, next_block + nblk))]
            next_block += nblk
            batch.add_request(r, toks, 0, live[r][2])
        scheduled = [r for r in live if rng.random() < 0.8]
        for r in [r for r in batch.req_id_to_index if r not in scheduled]:
            batch.remove_request(r)
        for r in scheduled:
            if r not in batch:
                batch.add_request(r, *live[r])
        batch.condense()
        if prompts_last:  # (the model runner's, for an MLA model's prefill)
            batch.put_last(batch.num_computed_tokens[:batch.num_reqs] == 0)
            new = batch.num_computed_tokens[:batch.num_reqs] == 0
            assert not np.any(new[:-1] & ~new[1:])  # no earlier row new, a later one not
        order = batch.req_ids[:batch.num_reqs]
        assert sorted(order) == sorted(scheduled)
        assert all(batch.req_id_to_index[r] == i for i, r in enumerate(order))
        sched = [min(len(live[r][0]) - live[r][1], int(rng.integers(1, 6))) or 1 for r in order]
        for r, n in zip(order, sched):  # a request caught up samples one more token first
            toks, computed, blocks = live[r]
            while computed + n > len(toks):
                toks.append(int(rng.integers(0, 1000)))
                batch.append_token(r, toks[-1])
            need = -(-(computed + n) // BS) - len(blocks)
            if need > 0:
                new = list(range(next_block, next_block + need))
                next_block += need
                blocks += new
                batch.append_blocks(r, new)
        bufs = [np.full(64, -7, np.int32) for _ in range(3)]
        qsl, lens = np.zeros(9, np.int32), np.zeros(8, np.int32)
        t = batch.prepare_inputs(np.array(sched, np.int32), *bufs, qsl, lens)
        ids, pos, slots, want_lens = naive([live[r] for r in order], sched)
        assert t == len(ids) == sum(sched)
        assert bufs[0][:t].tolist() == ids and bufs[1][:t].tolist() == pos
        assert bufs[2][:t].tolist() == slots
        assert lens[:len(order)].tolist() == want_lens
        assert qsl[:len(order) + 1].tolist() == [0, *np.cumsum(sched).tolist()]
        for r, n in zip(order, sched):
            live[r][1] += n
            batch.num_computed_tokens[batch.req_id_to_index[r]] = live[r][1]
