"""LoRAModelManager (vLLM's LRUCacheLoRAModelManager): wraps the model's projections with LoRA
layers, keeps up to max_cpu_loras adapters loaded (least recently used evicted, reloaded from
their path when asked again), puts each step's adapters in the layers' max_loras slots (the
least recently used slot of an adapter the step does not run is rewritten), and tells the
layers which rows run which slot."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from vllmx import ops
from vllmx.config import LoRAConfig
from vllmx.distributed.tp_shard import shard_lora
from vllmx.layers.linear import Linear, MergedLinear
from vllmx.layers.placement import Placement
from vllmx.loader.hf_to_gguf import HF_ARCHITECTURES, permute_qk, unpermute_qk
from vllmx.lora.layers import LinearWithLoRA
from vllmx.lora.models import LoRAModel
from vllmx.lora.punica import PunicaWrapper
from vllmx.lora.request import LoRARequest
from vllmx.models.commandr import CohereDecoderLayer
from vllmx.models.gemma3 import Gemma3DecoderLayer
from vllmx.models.llama import GGUF_PERMUTED_QK, LlamaDecoderLayer
from vllmx.models.olmo2 import Olmo2DecoderLayer
from vllmx.models.stablelm import StableLmDecoderLayer
from vllmx.worker.worker_base import DTYPE_BY_NAME

# Decoder layers whose projections are these attributes, as Linear / MergedLinear (each family
# checked against peft: tests/lora).
_LORA_LAYERS = (LlamaDecoderLayer, Gemma3DecoderLayer, Olmo2DecoderLayer, StableLmDecoderLayer,
                CohereDecoderLayer)
# Attribute of a decoder layer -> the PEFT module names of its output slices.
_TARGETS = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "o_proj": ["o_proj"],
            "gate_up_proj": ["gate_proj", "up_proj"], "down_proj": ["down_proj"]}


class LoRAModelManager:
    def __init__(self, model, lora_config: LoRAConfig, max_num_tokens: int,
                 base: BaseLayout | None = None, dtype: int = ops.F32,
                 place: Placement | None = None):
        self.lora_config = lora_config
        self.base = base or BaseLayout()
        place = place or Placement()
        self.punica = PunicaWrapper(max_num_tokens, place.on_gpu)
        # per layer: PEFT module name -> the LoRA layer that holds it
        self.modules: list[dict[str, LinearWithLoRA]] = []
        # The decoder layers checked against peft (tests/lora).
        layers = getattr(model, "layers", None) or []
        # (a pipeline stage's model holds its own layers; the others are None)
        if not layers or not all(isinstance(la, _LORA_LAYERS) for la in layers
                                 if la is not None):
            raise ValueError(f"LoRA is not supported for {type(model).__name__} "
                             f"({type(layers[0]).__name__ if layers else 'no decoder layers'}) "
                             f"yet: vllmx applies adapters to the Llama-family decoders "
                             f"(LlamaForCausalLM and the architectures it runs), Gemma 2 / 3, "
                             f"OLMo 2 / 3, EXAONE 4, StableLM and Cohere (Command R, Cohere 2)")
        for layer in layers:
            found = {}
            for attr, slices in _TARGETS.items() if layer is not None else ():
                base = getattr(layer, attr, None)
                if isinstance(base, (Linear, MergedLinear)):
                    wrapped = LinearWithLoRA(base, slices, self.punica, lora_config.max_loras,
                                             lora_config.max_lora_rank, dtype, place)
                    setattr(layer, attr, wrapped)
                    found.update({m: wrapped for m in slices})
            self.modules.append(found)
        self.requests: dict[int, LoRARequest] = {}  # every adapter added, by lora_int_id
        self.loaded: OrderedDict[int, LoRAModel] = OrderedDict()  # least recently used first
        # The adapter id in each slot (None: empty), and the slots least recently used first.
        self.slots: list[int | None] = [None] * lora_config.max_loras
        self._slot_order: list[int] = list(range(lora_config.max_loras))
        # Tensor parallelism: this rank's group (adapters cut to its share, tp_shard.shard_lora)
        # and, on rank 0, the call that sends each step's slot writes and rows' slots to the
        # other ranks (executor.call), whose managers apply them (apply_step).
        self.tp_group = getattr(model, "tp_group", None)
        self.followers = None
        self._written: list[tuple[int, int]] = []  # (slot, adapter id) written this step

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
                         lora_requests: dict[int, LoRARequest]) -> dict[int, str]:
        """The step's adapter per row (0: the base model): each adapter in a slot (loaded
        again from its request where it was evicted, or removed while requests still run with
        it), and each row's slot for the layers. Returns the adapters that could not be loaded
        again (their files gone or changed), with the error: their rows run without them, and
        the model runner fails their requests, not the step."""
        step_ids = [i for i in np.unique(token_lora_ids).tolist() if i > 0]
        if len(step_ids) > len(self.slots):
            raise ValueError(f"LoRA: a step with {len(step_ids)} adapters, more than max_loras "
                             f"{len(self.slots)}")
        for lora_id in step_ids:  # (loading one then evicts none of the step's)
            if lora_id in self.loaded:
                self.loaded.move_to_end(lora_id)
        lut, failed = {0: -1}, {}
        for lora_id in step_ids:
            try:
                self._ensure_loaded(lora_requests[lora_id])
            except (ValueError, OSError) as e:
                failed[lora_id] = f"{type(e).__name__}: {e}"
                lut[lora_id] = -1
                continue
            lut[lora_id] = self._slot_for(lora_id, step_ids)
        slots = np.array([lut[i] for i in token_lora_ids.tolist()], dtype=np.int32)
        self.punica.update_metadata(slots)
        if self.followers is not None:
            self.followers("lora_step", [(slot, lora_requests[i]) for slot, i in self._written],
                           slots)
        self._written.clear()
        return failed

    def apply_step(self, written: list[tuple[int, LoRARequest]], slots: np.ndarray) -> None:
        """Another rank's step (rank 0 decided it, set_active_loras): the adapters rank 0 wrote
        into slots, loaded here too (this rank's share), and the rows' slots."""
        for slot, req in written:
            self.requests.setdefault(req.lora_int_id, req)
            self._ensure_loaded(req)
            self._write_slot(slot, req.lora_int_id)
        self.punica.update_metadata(slots)

    def _slot_for(self, lora_id: int, step_ids: list[int]) -> int:
        """The adapter's slot, written now where it has none: an empty slot, else the least
        recently used one of an adapter this step does not run."""
        if lora_id in self.slots:
            slot = self.slots.index(lora_id)
        else:
            slot = next((s for s in self._slot_order if self.slots[s] is None), None)
            if slot is None:
                slot = next(s for s in self._slot_order if self.slots[s] not in step_ids)
            self._write_slot(slot, lora_id)
            self._written.append((slot, lora_id))
        self._slot_order.remove(slot)
        self._slot_order.append(slot)
        return slot

    def _write_slot(self, slot: int, lora_id: int) -> None:
        lora = self.loaded[lora_id]
        for i, found in enumerate(self.modules):
            for target in dict.fromkeys(found.values()):
                target.set_lora(slot, {m: lora.loras[(i, m)] for m in target.slices
                                       if (i, m) in lora.loras})
        self.slots[slot] = lora_id

    def _activate(self, lora: LoRAModel) -> None:
        """Checks an adapter against the base model, its q/k B rows in the base's layout, and
        keeps it loaded (its slot is written when a step runs it)."""
        base = self.base
        if self.tp_group is not None:  # this rank's share of each matrix
            g = self.tp_group
            for (_, module), w in lora.loras.items():
                w.lora_a, w.lora_b = shard_lora(module, w.lora_a, w.lora_b, g.rank,
                                                g.world_size, base.num_heads, base.num_kv_heads)
        if lora.gguf_architecture is not None and lora.gguf_architecture != base.gguf_arch:
            raise ValueError(f"LoRA adapter {lora.name!r} is a GGUF adapter for architecture "
                             f"{lora.gguf_architecture!r}; the base model's is "
                             f"{base.gguf_arch!r}")
        for (i, module), w in lora.loras.items():
            target = self.modules[i].get(module) if i < len(self.modules) else None
            if target is None and i < len(self.modules) and not self.modules[i]:
                # another pipeline stage's layer: checked against this stage's same module
                # (the family's layers share their shapes), so that rank 0 refuses what a
                # later stage could not load
                target = next((m[module] for m in self.modules if module in m), None)
            if target is None:
                raise ValueError(f"LoRA adapter {lora.name!r}: layer {i} {module} is not in the "
                                 f"base model (or not a dense projection there)")
            target.check_lora(lora.name, module, w)
        if lora.qk_layout != base.qk_layout:
            if base.num_heads is None:
                raise ValueError(f"LoRA adapter {lora.name!r}: its q/k rows are laid out for "
                                 f"{lora.qk_layout!r} checkpoints, the base model's for "
                                 f"{base.qk_layout!r}, and its head counts are unknown")
            move = permute_qk if base.qk_layout == "gguf" else unpermute_qk
            tp = 1 if self.tp_group is None else self.tp_group.world_size
            for (_, module), w in lora.loras.items():  # (the rows of this rank's heads)
                heads = {"q_proj": base.num_heads // tp,
                         "k_proj": max(1, base.num_kv_heads // tp)}.get(module)
                if heads is not None:
                    w.lora_b = np.ascontiguousarray(move(w.lora_b, heads))
            lora.qk_layout = base.qk_layout
        while len(self.loaded) >= self.lora_config.max_cpu_loras:
            self._deactivate(next(iter(self.loaded)))
        self.loaded[lora.id] = lora

    def _deactivate(self, lora_id: int) -> bool:
        if self.loaded.pop(lora_id, None) is None:
            return False
        if lora_id in self.slots:  # (its slot is free; what it holds is rewritten on reuse)
            self.slots[self.slots.index(lora_id)] = None
        return True


@dataclass
class BaseLayout:
    """What an adapter's rows must follow: the base model's q/k row layout ("gguf": Meta's
    interleaved rows of a GGUF_PERMUTED_QK arch's GGUF; "hf" otherwise), its head counts (for
    permuting a PEFT adapter's q/k B rows onto a GGUF base, or a GGUF adapter's onto a
    checkpoint) and its GGUF architecture (a GGUF adapter must name the same)."""

    qk_layout: str = "hf"
    num_heads: int | None = None
    num_kv_heads: int | None = None
    gguf_arch: str | None = None

    @staticmethod
    def of(model_config) -> BaseLayout:
        cfg = model_config.hf_config
        arch = cfg.get("gguf_architecture")
        if arch is None:  # a checkpoint: the GGUF arch llama.cpp's converter would give it
            arch = next((HF_ARCHITECTURES[a] for a in cfg.get("architectures") or []
                         if a in HF_ARCHITECTURES), None)
            layout = "hf"
        else:
            layout = "gguf" if arch in GGUF_PERMUTED_QK else "hf"
        heads = cfg.get("num_attention_heads")
        return BaseLayout(layout, heads, cfg.get("num_key_value_heads") or heads, arch)


def create_lora_manager(model, config, device: str,
                        act_dtype: int | None = None) -> LoRAModelManager:
    """The engine's manager, after the checks of what LoRA runs on (config: VllmxConfig;
    act_dtype: the GPU's activation dtype, in which its stacks are kept)."""
    mc = config.model_config
    if device == "cpu" and mc.dtype not in ("auto", "float32"):
        raise ValueError(f"LoRA adapters need float32 activations on the CPU, got "
                         f"dtype={mc.dtype!r}")
    # (Decode steps replay their tapes / CUDA graphs: the rows' slots are the op's input, not
    # its shape.)
    place = Placement(device, act_dtype) if device == "cuda" else Placement()
    return LoRAModelManager(model, config.lora_config,
                            config.scheduler_config.max_num_batched_tokens, BaseLayout.of(mc),
                            lora_weight_dtype(config.lora_config.lora_dtype, mc), place)


def lora_weight_dtype(lora_dtype: str, model_config) -> int:
    """The adapters' weight dtype on the CPU: lora_dtype's, or for "auto" the checkpoint's
    dense weights' (vLLM keeps adapters in the model's dtype; a GGUF's: float32)."""
    if lora_dtype != "auto":
        return DTYPE_BY_NAME[lora_dtype]
    cfg = model_config.hf_config
    stored = None if model_config.is_gguf else cfg.get("torch_dtype", cfg.get("dtype"))
    return DTYPE_BY_NAME.get(stored, ops.F32)
