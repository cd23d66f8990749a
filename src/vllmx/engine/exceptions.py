"""The engine's errors as the server sees them (vLLM's vllm/v1/engine/exceptions.py names)."""


class EngineDeadError(RuntimeError):
    """The engine loop has stopped: no request can run until the process is restarted."""


class EngineGenerateError(RuntimeError):
    """One request failed inside the engine; the engine and the other requests go on."""
