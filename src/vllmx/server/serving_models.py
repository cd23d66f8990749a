"""vLLM's OpenAIServingModels: the served names (the base model's, and each LoRA adapter's),
/v1/models' cards (an adapter's parent is the base model), and loading and unloading adapters
at run time (/v1/load_lora_adapter, /v1/unload_lora_adapter: vLLM's request bodies and
answers)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from http import HTTPStatus

from vllmx.lora.request import LoRARequest
from vllmx.server.errors import OpenAIError
from vllmx.server.protocol import OpenAIBaseModel


class LoadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIBaseModel):
    lora_name: str
    lora_int_id: int | None = None


@dataclass
class LoRAModulePath:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str]) -> list[LoRAModulePath]:
    """vLLM's --lora-modules: name=path, or JSON {"name": ..., "path": ...,
    "base_model_name": ...}."""
    out = []
    for v in values:
        if v.lstrip().startswith("{"):
            d = json.loads(v)
            if not {"name", "path"} <= set(d):
                raise ValueError(f"--lora-modules {v!r}: JSON needs 'name' and 'path'")
            out.append(LoRAModulePath(d["name"], d["path"], d.get("base_model_name")))
        else:
            name, sep, path = v.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules {v!r}: expected name=path")
            out.append(LoRAModulePath(name, path))
    return out


class OpenAIServingModels:
    def __init__(self, engine_client, base_model_names: list[str], model_root: str,
                 max_model_len: int, lora_modules: list[LoRAModulePath] | None = None):
        self.engine_client = engine_client
        self.base_model_names = base_model_names
        self.model_root = model_root
        self.max_model_len = max_model_len
        self.static_lora_modules = lora_modules or []
        self.lora_requests: dict[str, LoRARequest] = {}
        self.lora_id_counter = 0  # ids are never reused: the prefix cache is keyed by them

    async def init_static_loras(self) -> None:
        """Loads --lora-modules at start-up; a bad adapter stops the server with its error."""
        for m in self.static_lora_modules:
            await self._load(m.name, m.path, m.base_model_name)

    def is_base_model(self, name: str | None) -> bool:
        return not name or name in self.base_model_names

    def lora_request(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names (None: the base model); 404 for neither."""
        if self.is_base_model(model):
            return None
        lora = self.lora_requests.get(model)
        if lora is None:
            raise OpenAIError(f"The model `{model}` does not exist.", HTTPStatus.NOT_FOUND,
                              param="model")
        return lora

    def show_available_models(self) -> dict:
        now = int(time.time())
        cards = [{"id": name, "object": "model", "created": now, "owned_by": "vllmx",
                  "root": self.model_root, "parent": None, "max_model_len": self.max_model_len,
                  "permission": []} for name in self.base_model_names]
        cards += [{"id": lora.lora_name, "object": "model", "created": now, "owned_by": "vllmx",
                   "root": lora.lora_path,
                   "parent": lora.base_model_name or self.base_model_names[0],
                   "max_model_len": self.max_model_len, "permission": []}
                  for lora in self.lora_requests.values()]
        return {"object": "list", "data": cards}

    async def load_lora_adapter(self, body: LoadLoRAAdapterRequest) -> str:
        if not body.lora_name or not body.lora_path:
            raise OpenAIError("Both 'lora_name' and 'lora_path' must be provided.")
        if body.lora_name in self.lora_requests or body.lora_name in self.base_model_names:
            raise OpenAIError(f"The lora adapter '{body.lora_name}' has already been loaded.",
                              param="lora_name")
        await self._load(body.lora_name, body.lora_path)
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    async def unload_lora_adapter(self, body: UnloadLoRAAdapterRequest) -> str:
        if not body.lora_name:
            raise OpenAIError("'lora_name' needs to be provided to unload a LoRA adapter.")
        lora = self.lora_requests.get(body.lora_name)
        if lora is None or (body.lora_int_id is not None
                            and body.lora_int_id != lora.lora_int_id):
            raise OpenAIError(f"The lora adapter '{body.lora_name}' cannot be found.",
                              HTTPStatus.NOT_FOUND, param="lora_name")
        del self.lora_requests[body.lora_name]
        await self.engine_client.remove_lora(lora.lora_int_id)
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."

    async def _load(self, name: str, path: str, base_model_name: str | None = None) -> None:
        self.lora_id_counter += 1
        lora = LoRARequest(name, self.lora_id_counter, path, base_model_name)
        try:
            await self.engine_client.add_lora(lora)
        except ValueError as e:  # the adapter's own problem, named by the loader
            raise OpenAIError(str(e), param="lora_path") from e
        self.lora_requests[name] = lora
