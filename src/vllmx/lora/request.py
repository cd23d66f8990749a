"""vLLM's LoRARequest: which adapter a request runs with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRARequest:
    """lora_name names the adapter (the served model name), lora_int_id identifies it across
    the engine (> 0: 0 is the base model), lora_path is a PEFT checkpoint directory."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an int > 0, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError(f"LoRA adapter {self.lora_name!r}: lora_path is required")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other) -> bool:
        # vLLM's: equal by name, so one adapter is one adapter however it is requested.
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
