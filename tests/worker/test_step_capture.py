"""CPU step capture (worker/step_capture.py): a replayed tape reads the live inputs and gives the
eager forward's bits; a forward doing numpy work is refused; and through the engine, decode steps
replayed per bucket give bit-identical logits to eager steps as the batch shrinks and grows."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

from vllmx import ops
from vllmx.ops import Weight
from vllmx.worker.step_capture import LongLived, capture

rng = np.random.default_rng()


class Toy:
    """Weights for a small forward: embedding -> rms_norm -> linear -> silu_and_mul -> linear."""

    def __init__(self, layers: int = 1):
        self.table = Weight.from_numpy(rng.standard_normal((50, 16)).astype(np.float32))
        self.norm = rng.standard_normal(16).astype(np.float32)
        self.up = Weight.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
        self.down = [Weight.from_numpy(rng.standard_normal((16, 32)).astype(np.float32))
                     for _ in range(layers)]
        self.ids = np.zeros(8, np.int32)  # the persistent input buffer

    def forward(self, extra=None):
        h = ops.embedding(self.ids, self.table)
        for down in self.down:
            x = ops.rms_norm(h, self.norm, 1e-6)
            if extra is not None:
                x = extra(x)
            h = ops.linear(ops.silu_and_mul(ops.linear(x, self.up)), down)
        return h


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def test_replay_reads_the_inputs_and_matches_eager():
    toy = Toy(layers=3)
    toy.ids[:] = rng.integers(0, 50, 8)
    step, out = capture(toy.forward, LongLived(vars(toy)))
    assert len(step.tape) == 1 + 3 * 4
    assert bits(out) == bits(step.output)
    for _ in range(3):
        toy.ids[:] = rng.integers(0, 50, 8)
        assert bits(step.replay()) == bits(toy.forward())


def test_activations_share_an_arena():
    toy = Toy(layers=10)
    step, out = capture(toy.forward, LongLived(vars(toy)))
    arena = step.arena.buf
    # 10 layers make 40 activations of up to 8 x 64 floats; a few are alive at once.
    assert arena.nbytes < 6 * 8 * 64 * 4
    assert bits(step.replay()) == bits(out)


def test_tapes_share_an_arena_that_grows():
    """Tapes packed into one arena: a bigger one grows it and repoints the first, whose replays
    still match its eager forward; the arena holds the larger need, not the sum."""
    from vllmx.worker.step_capture import Arena

    small, big = Toy(layers=1), Toy(layers=1)
    big.ids = np.zeros(64, np.int32)
    big_alone = capture(big.forward, LongLived(vars(big)))[0].arena.size
    arena = Arena()
    s1, _ = capture(small.forward, LongLived(vars(small)), arena)
    size1 = arena.size
    s2, _ = capture(big.forward, LongLived(vars(big)), arena)
    assert size1 < big_alone == arena.size  # the larger tape's need, not the sum
    for _ in range(2):
        small.ids[:] = rng.integers(0, 50, 8)
        big.ids[:] = rng.integers(0, 50, 64)
        assert bits(s1.replay()) == bits(small.forward())
        assert bits(s2.replay()) == bits(big.forward())


def test_numpy_copy_inside_the_forward_is_refused():
    toy = Toy()
    with pytest.raises(ValueError, match=r"op 2 \(linear\) reads an array .* numpy work"):
        capture(lambda: toy.forward(lambda x: np.ascontiguousarray(x * 2)), LongLived(vars(toy)))


def test_numpy_in_place_inside_the_forward_is_refused():
    def double(x):
        x *= 2  # not an op: replay would skip it
        return x

    toy = Toy()
    with pytest.raises(RuntimeError, match="differs from the recorded one"):
        capture(lambda: toy.forward(double), LongLived(vars(toy)))


def test_ops_on_inputs_made_inside_the_forward_are_refused():
    """Every op records (the tape is generic), but sampling inside a forward reads sampler
    inputs numpy made there, which a replay would freeze: the capture refuses it."""
    toy = Toy()

    def sample(x):
        ops.sample(x, np.zeros(8, np.float32), np.zeros(8, np.int32), np.ones(8, np.float32),
                   np.zeros(8, np.float32), np.ones((8, 2), np.uint64))
        return x

    with pytest.raises(ValueError, match=r"op \d+ \(sample\) reads an array"):
        capture(lambda: toy.forward(sample), LongLived(vars(toy)))


def test_other_threads_are_not_recorded():
    toy = Toy()

    def other_thread(x):
        t = threading.Thread(target=lambda: ops.sample(
            np.zeros((1, 4), np.float32), np.zeros(1, np.float32), np.zeros(1, np.int32),
            np.ones(1, np.float32), np.zeros(1, np.float32), np.ones((1, 2), np.uint64)))
        t.start()
        t.join()
        return x

    step, _ = capture(lambda: toy.forward(other_thread), LongLived(vars(toy)))
    assert len(step.tape) == 5


# ---- through the engine: replayed decode steps against eager ones ----------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.models.test_gemma3_parity import make_checkpoint as make_gemma3
    from tests.models.tiny_checkpoints import make_checkpoint

    d = str(tmp_path_factory.mktemp("capture"))
    return {"llama": make_checkpoint("llama", "float32", d),
            "qwen3": make_checkpoint("qwen3", "float32", d),
            "gpt_neox": make_checkpoint("gpt_neox", "float32", d),  # LayerNorms, parallel adds
            "gpt2": make_checkpoint("gpt2", "float32", d),  # position embeddings
            "gemma3": make_gemma3("mixed", "float32", d)}


def run(model: str, enforce_eager: bool, prompts, params, **kw):
    """Tokens, a digest of every step's logits, and the buckets captured."""
    from vllmx import LLM

    llm = LLM(model, skip_tokenizer_init=True, enforce_eager=enforce_eager, device="cpu", **kw)
    engine = llm.llm_engine
    digests = []
    sampler = engine.model_runner.sampler

    class Logged:
        """The sampler, noting a digest of the logits of every step."""

        def __call__(self, logits, smd):
            digests.append(hashlib.sha256(bits(logits)).hexdigest())
            return sampler(logits, smd)

        def __getattr__(self, name):
            return getattr(sampler, name)

    engine.model_runner.sampler = Logged()
    outs = llm.generate(prompts, params)
    return ([o.outputs[0].token_ids for o in outs], digests,
            sorted(engine.model_runner.decode_capture.steps))


def staggered(vocab: int, n: int, seed: int, max_tokens: int = 24):
    """n prompts whose max_tokens differ, so that the decode batch shrinks as they finish
    and grows again as waiting ones start (max_num_seqs below n)."""
    from vllmx import SamplingParams

    r = np.random.default_rng(seed)
    prompts = [{"prompt_token_ids": r.integers(3, vocab, int(r.integers(3, 20))).tolist()}
               for _ in range(n)]
    params = [SamplingParams(temperature=0, max_tokens=int(r.integers(2, max_tokens)),
                             ignore_eos=True)
              for _ in range(n)]
    params[0] = SamplingParams(temperature=0.8, seed=7, max_tokens=max_tokens + 6, ignore_eos=True)
    return prompts, params


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "gpt_neox", "gpt2"])
def test_replayed_decode_steps_equal_eager(checkpoints, family):
    prompts, params = staggered(500, 14, seed=hash(family) % 1000)
    kw = {"max_num_seqs": 9, "max_num_batched_tokens": 64}
    eager = run(checkpoints[family], True, prompts, params, **kw)
    replayed = run(checkpoints[family], False, prompts, params, **kw)
    assert eager[2] == []  # enforce_eager: no tapes
    assert len(replayed[2]) >= 3, f"only buckets {replayed[2]} ran"  # buckets 1, 2, 4, 8, 9
    assert replayed[0] == eager[0]
    assert replayed[1] == eager[1]  # every step's logits, bit for bit


@pytest.mark.parametrize("fixture", ["smollm2_gguf", "gemma3_gguf"])
def test_real_gguf_replay_equals_eager(fixture, request):
    """Quantized weights (packed Q4_1 / Q8_0 kernels; Gemma's Q4_K_M mixes types inside a
    projection, which takes the concat path)."""
    model = request.getfixturevalue(fixture)
    prompts, params = staggered(1000, 5, seed=3, max_tokens=10)
    kw = {"max_num_seqs": 4, "max_model_len": 128}
    eager = run(model, True, prompts, params, **kw)
    replayed = run(model, False, prompts, params, **kw)
    assert len(replayed[2]) >= 2
    assert replayed[0] == eager[0]
    assert replayed[1] == eager[1]
