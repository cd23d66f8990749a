"""EngineClient (vLLM's name): everything the server asks of an engine. The server talks to
this interface only, never to the scheduler, the model or the runner, so that an engine in
another thread (AsyncLLM), another process or on other devices can stand behind it unchanged."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable

from vllmx.config import ModelConfig, VllmxConfig
from vllmx.core.scheduler import SchedulerStats
from vllmx.engine.exceptions import EngineDeadError
from vllmx.outputs import RequestOutput
from vllmx.sampling_params import SamplingParams


class EngineClient(ABC):
    @property
    @abstractmethod
    def vllm_config(self) -> VllmxConfig: ...

    @property
    def model_config(self) -> ModelConfig:
        return self.vllm_config.model_config

    @property
    @abstractmethod
    def errored(self) -> bool:
        """The engine has stopped for good (dead_error says why)."""

    @property
    @abstractmethod
    def dead_error(self) -> BaseException | None: ...

    @abstractmethod
    def add_dead_callback(self, callback: Callable[[], None]) -> None:
        """callback() runs once when the engine stops for good (from the engine's thread)."""

    @abstractmethod
    def generate(self, prompt, sampling_params: SamplingParams | None = None,
                 request_id: str | None = None, priority: int = 0,
                 lora_request=None) -> AsyncIterator[RequestOutput]:
        """One request's outputs as they come (with lora_request: under that adapter);
        closing the iterator aborts the request. Bad
        input raises ValueError before anything is queued; a failure of this request alone
        raises EngineGenerateError, a dead engine EngineDeadError."""

    @abstractmethod
    async def abort(self, request_id: str) -> None: ...

    @abstractmethod
    def get_tokenizer(self):
        """The tokenizer, or None (skip_tokenizer_init)."""

    @abstractmethod
    def get_scheduler_stats(self) -> SchedulerStats: ...

    def check_health(self) -> None:
        """Raises EngineDeadError when the engine has stopped."""
        if self.errored:
            raise EngineDeadError(f"the engine has stopped: {self.dead_error}")
