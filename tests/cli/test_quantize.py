"""`vllmx quantize`: a tiny random Llama (hidden 256, so the k-quants apply; llama3 rope; its own
byte-level BPE tokenizer) written as a GGUF of every type. llama.cpp loads each file; its logits
match a float64 forward of the file's own dequantized weights, and vllmx's logits on the same
file match llama.cpp's. F32 files of each architecture load in vllmx with the logits of the
safetensors checkpoint they came from."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.models.parity import check_positions, log_softmax, vllmx_prompt_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

ALL_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K",
             "Q4_K", "Q3_K", "Q2_K"]
VOCAB, N_HEAD, N_KV = 512, 4, 2
PROMPT = np.random.default_rng(7).integers(2, VOCAB, 48).tolist()
# Max |logit error| / max |logit| of llama.cpp against the float64 forward of the file's weights
# (it rounds activations to bf16 or 8-bit blocks and keeps an f16 KV cache), and of vllmx
# against llama.cpp on the same file. Measured: F32 0.001, F16 0.002, BF16 0.008, block types
# 0.02-0.06; bounds about twice that.
LLAMACPP_VS_DEQUANT = {"F32": 0.003, "F16": 0.005, "BF16": 0.02}
VLLMX_VS_LLAMACPP = {"F32": 0.003, "F16": 0.005, "BF16": 0.02}
DEFAULT_LLAMACPP_BOUND, DEFAULT_VLLMX_BOUND = 0.12, 0.08
ARGMAX_DELTA = 0.25  # nats: vllmx's argmax under llama.cpp's log-softmax (measured <= 0.07)


def write_tokenizer(path: str) -> None:
    """A byte-level BPE tokenizer.json trained on a fixed text (fewer tokens than the model's
    vocabulary, so the GGUF pads the rest), plus a tokenizer_config.json with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["The quick brown fox jumps over the lazy dog.", "Once upon a time, by the sea,",
            "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"]
    tok.train_from_iterator(text * 20, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                   "chat_template": "{% for m in messages %}{{ m['content'] }}<|im_end|>"
                                    "{% endfor %}"}, f)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("quantize") / "llama")
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=N_HEAD, num_key_value_heads=N_KV, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32})
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random init leaves near-uniform logits; widen them a little
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.to(torch.bfloat16).save_pretrained(path)  # a bf16 source, as most checkpoints are
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def quantized(llama_dir) -> dict[str, str]:
    from vllmx.cli.main import main

    files = {}
    for t in ALL_TYPES:
        files[t] = os.path.join(os.path.dirname(llama_dir), f"llama-{t}.gguf")
        assert main(["quantize", llama_dir, files[t], "--type", t]) == 0
    return files


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def dequantized_logits(llama_dir: str, path: str) -> np.ndarray:
    """float64 transformers forward with the GGUF file's weights, dequantized by gguf-py."""
    from vllmx.models.llama import gguf_name_to_hf

    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float64)
    state = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name == "rope_freqs.weight":
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        w = w.reshape(tuple(int(n) for n in reversed(t.shape.tolist())))
        name = gguf_name_to_hf(t.name)
        if name.endswith("q_proj.weight"):
            w = _unpermute(w, N_HEAD)
        elif name.endswith("k_proj.weight"):
            w = _unpermute(w, N_KV)
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        return model.eval()(torch.tensor([PROMPT])).logits[0].numpy()


def llamacpp_logits(path: str) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(path, n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    ref.eval(PROMPT)
    return np.asarray(ref.scores[: len(PROMPT)], dtype=np.float64)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_tensor_types_and_metadata(quantized, qtype):
    reader = gguf.GGUFReader(quantized[qtype])
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["rope_freqs.weight"] == "F32"
    for name, t in types.items():
        is_2d = any(k in name for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_",
                                        "token_embd", "output.weight"))
        assert t == (qtype if is_2d and "norm" not in name else "F32"), name
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert meta["general.architecture"] == "llama"
    assert meta["llama.embedding_length"] == 256 and meta["llama.rope.freq_base"] == 500000.0
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert len(meta["tokenizer.ggml.tokens"]) == VOCAB
    assert meta["tokenizer.ggml.tokens"][-1] == f"[PAD{VOCAB - 1}]"
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (0, 1)
    assert "<|im_end|>" in meta["tokenizer.chat_template"]


@pytest.mark.parametrize("qtype", ALL_TYPES)
def test_llamacpp_and_vllmx_agree(llama_dir, quantized, qtype):
    from vllmx import LLM, ops

    path = quantized[qtype]
    theirs = llamacpp_logits(path)
    assert np.isfinite(theirs).all()
    err = rel_err(theirs, dequantized_logits(llama_dir, path))
    assert err < LLAMACPP_VS_DEQUANT.get(qtype, DEFAULT_LLAMACPP_BOUND), f"{qtype}: {err:.4f}"
    if not ops.is_supported(ops.QUANTIZE_TYPES[qtype]):
        pytest.skip(f"vllmx has no {qtype} kernels yet")
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64)
    ours = vllmx_prompt_logits(llm, PROMPT).astype(np.float64)
    err = rel_err(ours, theirs)
    assert err < VLLMX_VS_LLAMACPP.get(qtype, DEFAULT_VLLMX_BOUND), f"{qtype}: {err:.4f}"
    report = check_positions(log_softmax(theirs), ours.argmax(-1), ARGMAX_DELTA)
    assert report.failed == 0, f"{qtype}: {report}"


def test_tokenizer_matches_hf(llama_dir, quantized):
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(os.path.join(llama_dir, "tokenizer.json"))
    ref = llama_cpp.Llama(quantized["Q8_0"], vocab_only=True, verbose=False)
    for text in ["The quick brown fox", "def fibonacci(n):\n    return 12345", "  spaces, é"]:
        assert ref.tokenize(text.encode(), add_bos=False) == hf.encode(text).ids, text


def test_requantize_from_gguf_is_identical(llama_dir, quantized, tmp_path):
    """F32 GGUF -> Q4_K equals safetensors -> Q4_K: same tensors, same bytes, same metadata."""
    from vllmx.cli.quantize import quantize_model

    out = str(tmp_path / "requant.gguf")
    counts = quantize_model(quantized["F32"], out, "Q4_K", output_type="Q6_K")
    assert counts == {"F32": 6, "Q4_K": 15, "Q6_K": 1}
    direct = {t.name: t for t in gguf.GGUFReader(quantized["Q4_K"]).tensors}
    reader = gguf.GGUFReader(out)
    for t in reader.tensors:
        if t.name != "output.weight":
            assert np.array_equal(t.data, direct[t.name].data), t.name
    a = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    b = {k: f.contents() for k, f in gguf.GGUFReader(quantized["Q4_K"]).fields.items()
         if not k.startswith("GGUF.")}
    assert a.keys() == b.keys() and a["tokenizer.ggml.merges"] == b["tokenizer.ggml.merges"]
    assert a["general.file_type"] == b["general.file_type"]


def test_fallback_types():
    from vllmx.cli.quantize import tensor_type

    assert tensor_type("blk.0.ffn_down.weight", (64, 512), "Q4_K") == ("Q4_K", None)
    assert tensor_type("blk.0.attn_norm.weight", (96,), "Q4_K") == ("F32", None)
    # MoE routers stay f32 (llama-quantize leaves ffn_gate_inp alone); the experts quantize
    assert tensor_type("blk.0.ffn_gate_inp.weight", (8, 256), "Q4_K") == ("F32", None)
    assert tensor_type("blk.0.ffn_up_exps.weight", (8, 64, 256), "Q4_K") == ("Q4_K", None)
    # only weights quantize: gpt-oss's expert biases [E, rows] stay f32, as llama-quantize's
    assert tensor_type("blk.0.ffn_up_exps.bias", (8, 256), "Q4_K") == ("F32", None)
    for qtype, want in [("Q2_K", "Q4_0"), ("Q3_K", "Q4_0"), ("Q4_K", "Q5_0"), ("Q5_K", "Q5_1"),
                        ("Q6_K", "Q8_0")]:
        got, msg = tensor_type("blk.0.ffn_down.weight", (64, 96), qtype)
        assert got == want and "96" in msg
    assert tensor_type("blk.0.ffn_down.weight", (64, 40), "Q4_K")[0] == "F16"
    assert tensor_type("blk.0.ffn_down.weight", (64, 40), "Q8_0")[0] == "F16"
    assert tensor_type("output.weight", (64, 256), "Q4_K", output_type="Q6_K")[0] == "Q6_K"
    assert tensor_type("token_embd.weight", (64, 256), "Q2_K", embedding_type="Q8_0")[0] == "Q8_0"


def test_errors(llama_dir, tmp_path, capsys):
    from vllmx.cli.main import main
    from vllmx.cli.quantize import quantize_model

    with pytest.raises(ValueError, match="IQ4_XS"):
        quantize_model(llama_dir, str(tmp_path / "x.gguf"), "IQ4_XS")
    bad = tmp_path / "gpt2"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert main(["quantize", str(bad), str(tmp_path / "y.gguf"), "--type", "Q8_0"]) == 2
    assert "GPT2LMHeadModel" in capsys.readouterr().err
    f64 = tmp_path / "f64"
    f64.mkdir()
    with open(os.path.join(llama_dir, "config.json")) as f:
        (f64 / "config.json").write_text(f.read())
    from safetensors.numpy import save_file

    save_file({"model.embed_tokens.weight": np.zeros((4, 4))}, str(f64 / "model.safetensors"))
    with pytest.raises(ValueError, match="F64"):
        quantize_model(str(f64), str(tmp_path / "z.gguf"), "Q8_0")


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3", "granite", "smollm3_gguf",
                                    "phi3", "glm4", "olmo2", "olmo2_bias", "olmo3",
                                    "exaone4_gguf", "gemma2", "gemma3"])
def test_f32_gguf_matches_checkpoint_in_vllmx(family, tmp_path):
    """Names, Q/K permutation, rope_freqs, biases, q/k norms, Gemma's 1 + w norms, Granite's
    multipliers, Phi-3's fused tensors and window, OLMo's post-norms, OLMo 3's windows and YaRN:
    the F32 GGUF gives vllmx the logits of the safetensors checkpoint it was written from."""
    from vllmx import LLM
    from vllmx.cli.quantize import quantize_model

    if family == "gemma3":
        from tests.models.test_gemma3_parity import make_checkpoint as make_gemma3

        src = make_gemma3("standard", "float32", str(tmp_path))
    elif family == "gemma2":
        from tests.models.test_gemma2_parity import make_checkpoint as make_gemma2

        src = make_gemma2("pattern2", "float32", str(tmp_path))
    else:
        from tests.models.tiny_checkpoints import make_checkpoint

        src = make_checkpoint(family, "float32", str(tmp_path))
    out = str(tmp_path / f"{family}.gguf")
    quantize_model(src, out, "F32")
    prompt = PROMPT[:30]
    a, b = (vllmx_prompt_logits(LLM(p, skip_tokenizer_init=True, max_model_len=64,
                                    kv_cache_dtype="float32"), prompt) for p in (src, out))
    assert rel_err(b, a) < 1e-5, family


@pytest.mark.parametrize("family,message", [("smollm3", "no_rope_layers"),
                                            ("gemma2", "layer_types"),
                                            ("exaone4", "EXAONE 4 with sliding layers")])
def test_what_gguf_cannot_express_is_refused_by_name(family, message, tmp_path):
    """llama.cpp fixes SmolLM3's NoPE layers (every 4th), Gemma 2's sliding layers (every other)
    and EXAONE 4's (3 of 4, at 64 layers only): a checkpoint that differs is refused, not
    written wrong."""
    from vllmx.cli.quantize import quantize_model

    if family == "gemma2":
        from tests.models.test_gemma2_parity import make_checkpoint as make_gemma2

        src = make_gemma2("mixed", "float32", str(tmp_path))
    else:
        from tests.models.tiny_checkpoints import make_checkpoint

        src = make_checkpoint(family, "float32", str(tmp_path))
    with pytest.raises(ValueError, match=message):
        quantize_model(src, str(tmp_path / "x.gguf"), "Q8_0")
    assert not os.path.exists(tmp_path / "x.gguf")
