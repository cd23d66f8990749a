"""Architecture name → model class, by HF `architectures` and by GGUF `general.architecture`."""

from __future__ import annotations

from vllmx.models.commandr import Cohere2ForCausalLM, CohereForCausalLM
from vllmx.models.deepseek_v2 import DeepseekV2ForCausalLM
from vllmx.models.falcon import FalconForCausalLM
from vllmx.models.falcon_h1 import FalconH1ForCausalLM
from vllmx.models.gemma3 import Gemma3ForCausalLM
from vllmx.models.gpt2 import GPT2LMHeadModel
from vllmx.models.gpt_neox import GPTNeoXForCausalLM
from vllmx.models.granitemoehybrid import GraniteMoeHybridForCausalLM
from vllmx.models.llama import LlamaForCausalLM
from vllmx.models.nemotron_h import NemotronHForCausalLM
from vllmx.models.olmo2 import Olmo2ForCausalLM
from vllmx.models.qwen3_next import Qwen3NextForCausalLM
from vllmx.models.stablelm import StableLmForCausalLM
from vllmx.models.starcoder2 import Starcoder2ForCausalLM

_HF_ARCHS = {
    "Cohere2ForCausalLM": Cohere2ForCausalLM,
    "CohereForCausalLM": CohereForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV2ForCausalLM,
    "Exaone4ForCausalLM": Olmo2ForCausalLM,
    "FalconForCausalLM": FalconForCausalLM,
    "FalconH1ForCausalLM": FalconH1ForCausalLM,
    "Gemma2ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Glm4ForCausalLM": LlamaForCausalLM,
    "Glm4MoeForCausalLM": LlamaForCausalLM,
    "GPT2LMHeadModel": GPT2LMHeadModel,
    "GptOssForCausalLM": LlamaForCausalLM,
    "GPTNeoXForCausalLM": GPTNeoXForCausalLM,
    "GraniteForCausalLM": LlamaForCausalLM,
    "GraniteMoeHybridForCausalLM": GraniteMoeHybridForCausalLM,
    "GraniteMoeForCausalLM": LlamaForCausalLM,
    "GraniteMoeSharedForCausalLM": LlamaForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": LlamaForCausalLM,
    "NemotronHForCausalLM": NemotronHForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Olmo3ForCausalLM": Olmo2ForCausalLM,
    "Phi3ForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen2MoeForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Qwen3MoeForCausalLM": LlamaForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForConditionalGeneration": Qwen3NextForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5MoeForConditionalGeneration": Qwen3NextForCausalLM,
    "SmolLM3ForCausalLM": LlamaForCausalLM,
    "StableLmForCausalLM": StableLmForCausalLM,
    "Starcoder2ForCausalLM": Starcoder2ForCausalLM,
}
_GGUF_ARCHS = {
    "cohere2": Cohere2ForCausalLM,
    "command-r": CohereForCausalLM,
    "deepseek2": DeepseekV2ForCausalLM,
    "exaone4": Olmo2ForCausalLM,
    "falcon": FalconForCausalLM,
    "falcon-h1": FalconH1ForCausalLM,
    "gemma2": Gemma3ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
    "glm4": LlamaForCausalLM,
    "glm4moe": LlamaForCausalLM,
    "gpt-oss": LlamaForCausalLM,
    "gpt2": GPT2LMHeadModel,
    "gptneox": GPTNeoXForCausalLM,
    "granite": LlamaForCausalLM,
    "granitemoe": LlamaForCausalLM,
    "granitehybrid": GraniteMoeHybridForCausalLM,
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "nemotron_h": NemotronHForCausalLM,
    "nemotron_h_moe": NemotronHForCausalLM,
    "olmo2": Olmo2ForCausalLM,
    "phi3": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "qwen3moe": LlamaForCausalLM,
    "qwen3next": Qwen3NextForCausalLM,
    "qwen35": Qwen3NextForCausalLM,
    "qwen35moe": Qwen3NextForCausalLM,
    "smollm3": LlamaForCausalLM,
    "stablelm": StableLmForCausalLM,
    "starcoder2": Starcoder2ForCausalLM,
}


class ModelRegistry:
    @staticmethod
    def get_supported_archs() -> list[str]:
        return sorted(_HF_ARCHS) + sorted(f"gguf:{a}" for a in _GGUF_ARCHS)


def get_model_class(hf_config: dict):
    gguf_arch = hf_config.get("gguf_architecture")
    if gguf_arch is not None:
        if gguf_arch not in _GGUF_ARCHS:
            raise ValueError(
                f"GGUF architecture {gguf_arch!r} is not supported; supported: "
                f"{', '.join(sorted(_GGUF_ARCHS))}"
            )
        return _GGUF_ARCHS[gguf_arch]
    archs = hf_config.get("architectures") or []
    _check_quantization(hf_config, archs)
    for arch in archs:
        if arch in _HF_ARCHS:
            return _HF_ARCHS[arch]
    pooling = any(a.endswith(("Model", "ForMaskedLM", "ForSequenceClassification"))
                  for a in archs)
    hint = " (a pooling model: run it with runner='pooling' / --runner pooling)" if pooling else ""
    raise ValueError(
        f"model architecture {archs or 'missing from config.json'} is not supported for "
        f"generation{hint}; supported: {', '.join(sorted(_HF_ARCHS))}"
    )


def _check_quantization(hf_config: dict, archs: list[str]) -> None:
    """A pre-quantized checkpoint (GPTQ, AWQ, FP8, bitsandbytes ...) is refused by name before
    its packed tensors fail in some other way; gpt-oss's MXFP4 experts are read (gpt_oss.py),
    the quant_methods loader/quantization.py lists dequantized at load."""
    quant = hf_config.get("quantization_config")
    if not quant:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "mxfp4" and "GptOssForCausalLM" in archs:
        return
    from vllmx.loader import quantization

    if isinstance(quant, dict) and quantization.check_config(quant):
        return
    raise ValueError(
        f"quantization_config quant_method {method!r} is not supported: vllmx reads f32 / f16 / "
        f"bf16 safetensors (and gpt-oss's MXFP4 experts, and the quant_methods "
        f"{', '.join(sorted(quantization.methods()))}) and GGUF files; use a GGUF of this "
        f"model, or `vllmx quantize` one from its unquantized checkpoint")
