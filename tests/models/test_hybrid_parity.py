"""Hybrid models (Gated DeltaNet layers beside attention: Qwen3-Next, Qwen3.5 dense and MoE, and
the text part of a Qwen3.5 ...ForConditionalGeneration checkpoint; Mamba2 layers beside
attention: Granite-4's GraniteMoeHybrid, with experts and without, with rope and without;
Nemotron-H's one-mixer blocks with relu^2 MLPs and experts; Falcon-H1's Mamba2 and attention side
by side, its muP multipliers folded into the matrices): token parity with
transformers in f32 and bf16 for tiny random checkpoints, what sets the model apart moving
the logits, and the request state the engine keeps for it: a state slot per running request,
taken and given back across chunked prefill, preemption and aborts, so that a batch gives each
request's tokens alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.models.parity import assert_prompt_logits_match, vllmx_prompt_logits
from tests.models.test_llama_family_parity import SEED, random_prompts, run_parity
from tests.models.tiny_checkpoints import VOCAB, make_checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny-hybrid"))


FAMILIES = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "granite_moe_hybrid", "granite_hybrid_dense",
            "nemotron_h", "falcon_h1", "falcon_h1_no_norm"]


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_f32(family, ckpt_dir):
    path = make_checkpoint(family, "float32", ckpt_dir)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, family, SEED)
    runner = llm.llm_engine.model_runner
    assert runner.state_slots is not None  # the runner keeps state slots for its mixers
    assert not llm.llm_engine.config.cache_config.enable_prefix_caching


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_bf16(family, ckpt_dir):
    path = make_checkpoint(family, "bfloat16", ckpt_dir)
    run_parity(path, path, "float32")  # an f32 KV cache, as for every MoE


def test_conditional_generation_checkpoint_runs_its_text_part(tmp_path):
    """Qwen3.5 ships as ...ForConditionalGeneration: text_config, model.language_model.*, a
    vision tower (not loaded); its language model runs as transformers' causal LM does."""
    import transformers as tf

    text = tf.Qwen3_5TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
                                linear_num_key_heads=2, linear_key_head_dim=16,
                                linear_value_head_dim=12, max_position_embeddings=512)
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": 64}
    torch.manual_seed(1234)
    model = tf.Qwen3_5ForConditionalGeneration(
        tf.Qwen3_5Config(text_config=text.to_dict(), vision_config=vision)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
    path = str(tmp_path / "qwen3_5-vl")
    model.save_pretrained(path)
    llm, prompts, oracle = run_parity(path, path)
    assert_prompt_logits_match(llm, prompts, oracle, "qwen3_5 (vl)", SEED)


@pytest.mark.parametrize("family,feature", [
    ("qwen3_next", "output_gate"), ("qwen3_next", "shared_expert_gate"), ("qwen3_next", "conv"),
    ("granite_moe_hybrid", "conv"), ("granite_moe_hybrid", "ssm_skip"),
    ("granite_moe_hybrid", "dt_limit"), ("nemotron_h", "ssm_skip"), ("nemotron_h", "groups")])
def test_each_feature_matters(family, feature, ckpt_dir):
    from vllmx import LLM
    from vllmx.layers.linear import Linear
    from vllmx.ops import Weight

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True)
    prompt = random_prompts(np.random.default_rng(SEED))[0]
    base = vllmx_prompt_logits(llm, prompt)
    for layer in llm.llm_engine.model.layers:
        mixer_is_recurrent = getattr(layer, "linear", False) or getattr(layer, "mamba", False)
        if feature == "ssm_skip" and mixer_is_recurrent:
            layer.mixer.D = np.zeros_like(layer.mixer.D)
        elif feature == "dt_limit" and mixer_is_recurrent:
            layer.mixer.dt_limit = (0.0, 0.05)
        elif feature == "groups" and getattr(layer, "kind", "") == "moe":
            r = layer.mixer.experts.routing
            layer.mixer.experts.routing = dataclasses.replace(r, topk_group=r.num_expert_group)
        elif feature == "output_gate" and not layer.linear:
            shape = layer.mixer.gate_proj.weight.shape  # sigmoid(0): every gate one half
            layer.mixer.gate_proj = Linear(Weight.from_numpy(np.zeros(shape, np.float32)))
        elif feature == "shared_expert_gate" and hasattr(layer.mlp, "shared_expert_gate"):
            layer.mlp.shared_expert_gate = None
        elif feature == "conv" and mixer_is_recurrent:
            w = np.zeros_like(layer.mixer.conv_weight)
            w[:, -1] = 1  # the identity: the token alone
            layer.mixer.conv_weight = w
    moved = vllmx_prompt_logits(llm, prompt)
    assert np.abs(moved - base).max() / np.abs(base).max() > 1e-2, feature


@pytest.mark.parametrize("family", ["qwen3_next", "granite_moe_hybrid", "nemotron_h",
                                    "falcon_h1"])
def test_batched_equals_alone_with_chunks_preemption_and_aborts(family, ckpt_dir):
    """12 requests through 4 sequence slots, 32-token steps (prompts in chunks) and a KV cache
    too small for all (preemption: the state is recomputed from a fresh slot): each gives its
    tokens alone; an aborted request's slot goes back and serves the next ones."""
    from vllmx import LLM, SamplingParams

    llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True,
              max_num_seqs=4, max_num_batched_tokens=32, num_gpu_blocks_override=10,
              block_size=16, max_model_len=160)
    rng = np.random.default_rng()
    # The first four long enough (>= 84 tokens, 6 blocks each) that running together they need
    # more than the 10 blocks: random lengths alone sometimes all fit (no preemption).
    lengths = [int(rng.integers(60, 70)) for _ in range(4)] + [int(rng.integers(5, 70))
                                                              for _ in range(8)]
    outs = [int(rng.integers(24, 30)) for _ in range(4)] + [int(rng.integers(4, 30))
                                                           for _ in range(8)]
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, n).tolist()} for n in lengths]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in outs]
    engine = llm.llm_engine
    batched = llm.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0, "the cache was meant to be too small"
    # Aborts: two requests stopped mid-prefill / mid-decode, then everything again.
    for i in range(3):
        engine.add_request(f"abort-{i}", prompts[i], params[i])
    engine.step()
    engine.step()
    engine.abort_request(["abort-0", "abort-2"])
    while engine.has_unfinished_requests():
        engine.step()
    for i, p in enumerate(prompts):
        alone = llm.generate([p], [params[i]])[0].outputs[0].token_ids
        assert alone == batched[i].outputs[0].token_ids, f"request {i}"
    # No slot lost: the runner hears of a finished request at the next step, so the last one
    # may still hold its slot.
    slots = engine.model_runner.state_slots
    assert sorted(slots._free + list(slots._slot.values())) == [0, 1, 2, 3]
    assert len(slots._slot) <= 1


def test_slots_of_the_last_steps_finishers_come_back(ckpt_dir):
    """Asynchronous scheduling (the GPU's), prompts in chunks: requests that finish in a
    generate's last steps are heard of by the runner only with the next step it runs (an empty
    schedule is never run), so generate after generate of them through 8 slots must not run
    the slots out, and each gives the same tokens."""
    from vllmx import LLM, SamplingParams

    llm = LLM(make_checkpoint("qwen3_next", "float32", ckpt_dir), skip_tokenizer_init=True,
              max_num_seqs=8, max_model_len=96, max_num_batched_tokens=64,
              async_scheduling=True)
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, 32).tolist()} for _ in range(8)]
    runs = [[o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(
        temperature=0, max_tokens=m, ignore_eos=True))] for m in (1, 9, 1, 9, 1)]
    assert runs[0] == runs[2] == runs[4] and runs[1] == runs[3]
    slots = llm.llm_engine.model_runner.state_slots
    assert sorted(slots._free + list(slots._slot.values())) == list(range(8))


@pytest.mark.parametrize("family", ["qwen3_next", "granite_moe_hybrid", "falcon_h1"])
def test_taped_decode_steps_equal_eager_ones(family, ckpt_dir, monkeypatch):
    """Decode steps replay CPU tapes for hybrids too (their state ops update the request's slot
    rows in place): a batch's tokens and logprobs are the eager engine's bit for bit, over
    several buckets, with requests finishing at different steps. A tape's check replays the
    step with its first request alone live (the others padding rows: no KV write, the scratch
    state slot), so its snapshot holds that request's state rows whatever the batch (a
    batch's worth was 246 MB at 16 requests of a Granite-shaped model)."""
    from vllmx import LLM, SamplingParams
    from vllmx.worker import step_capture

    rows = []
    snapshot = step_capture.StateRows.snapshot

    def counted(self):
        saved = snapshot(self)
        rows.append(saved[0].shape[0])
        return saved

    monkeypatch.setattr(step_capture.StateRows, "snapshot", counted)
    rng = np.random.default_rng()
    prompts = [{"prompt_token_ids": rng.integers(3, VOCAB, int(rng.integers(5, 40))).tolist()}
               for _ in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=int(rng.integers(3, 24)), logprobs=2,
                             ignore_eos=True) for _ in prompts]
    runs = []
    for eager in (False, True):
        llm = LLM(make_checkpoint(family, "float32", ckpt_dir), skip_tokenizer_init=True,
                  max_num_seqs=8, max_model_len=128, enforce_eager=eager)
        outs = llm.generate(prompts, params)
        runs.append([(o.outputs[0].token_ids, [{k: v.logprob for k, v in lp.items()}
                                               for lp in o.outputs[0].logprobs]) for o in outs])
        if not eager:
            assert llm.llm_engine.model_runner.decode_capture.steps, "no decode step was taped"
    assert runs[0] == runs[1]
    assert rows and set(rows) == {1}, rows  # one capture a batch size, one request's rows


@pytest.mark.parametrize("family", FAMILIES)
def test_dummy_shapes_are_the_checkpoints(family, ckpt_dir):
    import json
    import os

    from safetensors import safe_open

    from vllmx.models.registry import get_model_class

    path = make_checkpoint(family, "float32", ckpt_dir)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with safe_open(os.path.join(path, "model.safetensors"), "np") as f:
        real = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert get_model_class(cfg).checkpoint_shapes(cfg) == real
    if family == "qwen3_5_moe":  # its released configs have no intermediate_size (all sparse)
        del cfg["intermediate_size"]
        assert get_model_class(cfg).checkpoint_shapes(cfg) == real


def test_mamba_ssm_cache_dtype_on_the_cpu(ckpt_dir):
    """vLLM's mamba_ssm_cache_dtype: the CPU keeps f32 states (its activations' dtype), so auto
    and float32 give the same tokens and f32 states, and a 16-bit dtype is an error naming the
    field; an unknown name is refused before any model loads."""
    from vllmx import LLM, SamplingParams

    path = make_checkpoint("qwen3_next", "float32", ckpt_dir)
    prompts = [{"prompt_token_ids": list(range(3, 40))}]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = []
    for value in ("float32", "auto"):
        llm = LLM(path, skip_tokenizer_init=True, mamba_ssm_cache_dtype=value)
        outs.append(llm.generate(prompts, sp, use_tqdm=False)[0].outputs[0].token_ids)
        mixer = next(a for a in llm.llm_engine.model_runner.model.state_arrays()
                     if a.ndim == 4)
        assert mixer.dtype == np.float32
        del llm
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="mamba_ssm_cache_dtype 'bfloat16'.*float32"):
        LLM(path, skip_tokenizer_init=True, mamba_ssm_cache_dtype="bfloat16")
    with pytest.raises(ValueError, match="mamba_ssm_cache_dtype 'int8' is not one of"):
        LLM(path, skip_tokenizer_init=True, mamba_ssm_cache_dtype="int8")
