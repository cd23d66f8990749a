"""LoRAModelManager (vLLM's LRUCacheLoRAModelManager): wraps the model's projections with LoRA
layers, keeps up to max_cpu_loras adapters loaded (least recently used evicted, reloaded from
their path when asked again), and tells the layers which rows run which adapter each step."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from vllmx.config import LoRAConfig
from vllmx.layers.linear import Linear, MergedLinear
from vllmx.lora.layers import LinearWithLoRA
from vllmx.lora.models import LoRAModel
from vllmx.lora.punica import PunicaWrapper
from vllmx.lora.request import LoRARequest
from vllmx.models.llama import LlamaDecoderLayer

# Attribute of a decoder layer -> the PEFT module names of its output slices.
_TARGETS = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "o_proj": ["o_proj"],
            "gate_up_proj": ["gate_proj", "up_proj"], "down_proj": ["down_proj"]}


class LoRAModelManager:
    def __init__(self, model, lora_config: LoRAConfig):
        self.lora_config = lora_config
        self.punica = PunicaWrapper()
        # per layer: PEFT module name -> the LoRA layer that holds it
        self.modules: list[dict[str, LinearWithLoRA]] = []
        # The Llama-family decoder layer only: the one checked against peft (tests/lora).
        layers = getattr(model, "layers", None) or []
        if not layers or not all(isinstance(la, LlamaDecoderLayer) for la in layers):
            raise ValueError(f"LoRA is not supported for {type(model).__name__} "
                             f"({type(layers[0]).__name__ if layers else 'no decoder layers'}) "
                             f"yet: vllmx applies adapters to the Llama-family decoders "
                             f"(LlamaForCausalLM and the architectures it runs)")
        for layer in layers:
            found = {}
            for attr, slices in _TARGETS.items():
                base = getattr(layer, attr, None)
                if isinstance(base, (Linear, MergedLinear)):
                    wrapped = LinearWithLoRA(base, slices, self.punica)
                    setattr(layer, attr, wrapped)
                    found.update({m: wrapped for m in slices})
            self.modules.append(found)
        self.requests: dict[int, LoRARequest] = {}  # every adapter added, by lora_int_id
        self.loaded: OrderedDict[int, LoRAModel] = OrderedDict()  # least recently used first

    def add_adapter(self, req: LoRARequest) -> None:
        """Loads (or refreshes as most recently used) an adapter; a bad checkpoint raises
        ValueError naming it, before any request runs with it."""
        known = self.requests.get(req.lora_int_id)
        if known is not None and (known.lora_name, known.lora_path) != (req.lora_name,
                                                                        req.lora_path):
            raise ValueError(f"lora_int_id {req.lora_int_id} is already adapter "
                             f"{known.lora_name!r} ({known.lora_path}); give "
                             f"{req.lora_name!r} its own id")
        self._ensure_loaded(req)
        self.requests[req.lora_int_id] = req

    def _ensure_loaded(self, req: LoRARequest) -> None:
        if req.lora_int_id in self.loaded:
            self.loaded.move_to_end(req.lora_int_id)
            return
        self._activate(LoRAModel.from_local_checkpoint(req, self.lora_config.max_lora_rank))

    def remove_adapter(self, lora_id: int) -> bool:
        self.requests.pop(lora_id, None)
        return self._deactivate(lora_id)

    def list_adapters(self) -> dict[int, LoRARequest]:
        return dict(self.requests)

    def set_active_loras(self, token_lora_ids: np.ndarray,
                         lora_requests: dict[int, LoRARequest]) -> None:
        """The step's adapter per row (0: the base model); adapters evicted (or removed while
        requests still run with them) are loaded again from their requests."""
        for lora_id in np.unique(token_lora_ids).tolist():
            if lora_id > 0:
                self._ensure_loaded(lora_requests[lora_id])
        self.punica.update_metadata(token_lora_ids)

    def _activate(self, lora: LoRAModel) -> None:
        per_module: dict[int, dict[LinearWithLoRA, dict]] = {}
        for (i, module), w in lora.loras.items():
            target = self.modules[i].get(module) if i < len(self.modules) else None
            if target is None:
                raise ValueError(f"LoRA adapter {lora.name!r}: layer {i} {module} is not in the "
                                 f"base model (or not a dense projection there)")
            target.check_lora(lora.name, module, w)
            per_module.setdefault(i, {}).setdefault(target, {})[module] = w
        while len(self.loaded) >= self.lora_config.max_cpu_loras:
            self._deactivate(next(iter(self.loaded)))
        for targets in per_module.values():
            for target, per_slice in targets.items():
                target.set_lora(lora.id, per_slice)
        self.loaded[lora.id] = lora

    def _deactivate(self, lora_id: int) -> bool:
        if self.loaded.pop(lora_id, None) is None:
            return False
        for found in self.modules:
            for target in set(found.values()):
                target.reset_lora(lora_id)
        return True


def create_lora_manager(model, config, device: str) -> LoRAModelManager:
    """The engine's manager, after the checks of what LoRA runs on (config: VllmxConfig)."""
    mc = config.model_config
    if device != "cpu":
        raise ValueError(f"LoRA adapters run on the CPU only so far (device is {device!r}); "
                         f"start with device='cpu'")
    if mc.is_gguf:
        # llama.cpp's converter reorders q/k rows for some archs (GPT-J rope); a PEFT
        # adapter's B rows follow the Hugging Face order.
        raise ValueError("LoRA adapters need a safetensors base checkpoint; GGUF bases are "
                         "not supported yet")
    if mc.dtype not in ("auto", "float32"):
        raise ValueError(f"LoRA adapters need float32 activations on the CPU, got "
                         f"dtype={mc.dtype!r}")
    # The CPU step tapes replay a decode step's ops as recorded; the adapters' rows change
    # from step to step, so decode steps run eagerly.
    mc.enforce_eager = True
    return LoRAModelManager(model, config.lora_config)
