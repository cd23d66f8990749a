"""Building the engine a checkpoint needs: its runner (vLLM's --runner / --convert) resolved
from its architecture, then an LLMEngine for generation or a PoolingEngine for pooling, and the
server's EngineClient over it."""

from __future__ import annotations

from vllmx.pooler_config import checkpoint_architectures, resolve_runner


def create_engine(args):
    """An LLMEngine or, for a pooling runner, a PoolingEngine over EngineArgs `args`, with
    model_config.runner_type / convert_type resolved from the checkpoint."""
    from vllmx.loader.model_source import resolve_model
    from vllmx.worker.cuda_worker import resolve_device

    resolve_device(args.device)  # a device that cannot run fails before the model is read
    path = resolve_model(args.model, weights=args.load_format != "dummy")
    config = args.create_engine_config()
    archs = config.model_config.hf_overrides.get("architectures") or checkpoint_architectures(path)
    runner, convert = resolve_runner(list(archs), args.runner, args.convert)
    config.model_config.runner_type, config.model_config.convert_type = runner, convert
    if runner == "pooling":
        from vllmx.engine.pooling_engine import PoolingEngine

        return PoolingEngine(config, args.pooler_config)
    from vllmx.engine.llm_engine import LLMEngine

    return LLMEngine(config)


def create_engine_client(args):
    """The server's EngineClient: AsyncLLM over a generative model, AsyncPoolingLLM over a
    pooling one."""
    engine = create_engine(args)
    if engine.config.model_config.runner_type == "pooling":
        from vllmx.engine.async_pooling import AsyncPoolingLLM

        return AsyncPoolingLLM(engine)
    from vllmx.engine.async_llm import AsyncLLM

    return AsyncLLM(engine)
