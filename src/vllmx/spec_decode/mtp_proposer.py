"""Multi-token-prediction drafting (vLLM's mtp method): the target checkpoint's own MTP layer
(models/mtp.py) proposes k tokens greedily from the target's hidden states, the way an EAGLE
head does (spec_decode/eagle.py: the passes over the target's kept rows, the chained drafts, the
KV layer in the target's blocks at index num_hidden_layers). The first MTP layer drafts every
step (the released checkpoints have one)."""

from __future__ import annotations

from vllmx.config import ModelConfig, SpeculativeConfig, VllmxConfig
from vllmx.spec_decode.eagle import EagleProposer

# Architectures whose checkpoints store MTP layers past the last decoder layer
# (model.layers.{N}.*), and vllmx runs.
MTP_ARCHS = ("DeepseekV3ForCausalLM", "Glm4MoeForCausalLM")
# Those that store them as mtp.* (Qwen3-Next, Qwen3.5: models/mtp.py's Qwen3NextMTP), which
# their configs may not count (num_nextn_predict_layers / mtp_num_hidden_layers): the
# checkpoint's tensors say.
QWEN3_NEXT_MTP_ARCHS = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                        "Qwen3_5ForConditionalGeneration",
                        "Qwen3_5MoeForConditionalGeneration")


def mtp_layer_count(mc: ModelConfig) -> int:
    """The KV layers MTP drafting adds to the target's cache (one: the first MTP layer drafts
    every step); ValueError naming the model where it has no MTP layer vllmx can run."""
    archs = mc.architectures or [mc.hf_config.get("gguf_architecture") or "unknown"]
    what = f"{mc.model!r} ({', '.join(archs)})"
    num = mc.hf_config.get("num_nextn_predict_layers")
    if any(a in QWEN3_NEXT_MTP_ARCHS for a in archs):
        num = 1 if num is None else num
    elif not any(a in MTP_ARCHS for a in archs):
        raise ValueError(f"speculative_config method 'mtp' drafts with the target's own "
                         f"multi-token-prediction layers; {what} has none that vllmx runs "
                         f"(MTP architectures: {', '.join(MTP_ARCHS + QWEN3_NEXT_MTP_ARCHS)})")
    if not num:
        raise ValueError(f"speculative_config method 'mtp': {what} has no multi-token-"
                         f"prediction layers (num_nextn_predict_layers = {num!r})")
    if mc.is_gguf or mc.load_format == "dummy":
        raise ValueError(f"speculative_config method 'mtp' reads the MTP layer from the "
                         f"safetensors checkpoint; {what} is "
                         f"{'a GGUF file' if mc.is_gguf else 'load_format=dummy'}")
    return 1


class MTPProposer(EagleProposer):
    def load_model(self, config: VllmxConfig, spec: SpeculativeConfig, target):
        from vllmx.loader.safetensors import load_safetensors
        from vllmx.models.mtp import MultiTokenPredictorLayer, Qwen3NextMTP

        mc = config.model_config
        mtp_layer_count(mc)
        n = target.config["num_hidden_layers"]
        weights = load_safetensors(mc.path)
        if any(a in QWEN3_NEXT_MTP_ARCHS for a in mc.architectures or ()):
            if "mtp.fc.weight" not in weights:
                raise ValueError(f"speculative_config method 'mtp': {mc.model!r} has no MTP "
                                 f"layer (no mtp.* tensors: the checkpoint was saved without "
                                 f"it)")
            model = Qwen3NextMTP(target, weights)
        elif f"model.layers.{n}.eh_proj.weight" not in weights:
            raise ValueError(f"speculative_config method 'mtp': {mc.model!r} lacks its MTP "
                             f"layer's tensors (model.layers.{n}.*; num_nextn_predict_layers "
                             f"says it has one, but the checkpoint was saved without it)")
        else:
            model = MultiTokenPredictorLayer(target, weights)
        if len(self.kv_caches) <= model.layer_idx:
            raise RuntimeError("mtp: the KV cache has no layer for the MTP layer")
        return model
