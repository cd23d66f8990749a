"""Random weights for a config.json written by gpu_vs_vllm.write_config, saved as safetensors
beside it, so that vllmx and vLLM run the same weights. Their load_format="dummy" values
(uniform in +-1e-3, norms included) leave the residual stream noise, and a mixture of experts'
router then picks experts in a pattern of each engine's own: how many distinct experts a decode
batch reads, which sets what its MoE layers cost, differs between engines. Here matrices are
N(0, 0.02) (transformers' init), norms 1, biases 0, as a trained model's routing is spread.

Needs torch and safetensors (the vLLM bundle's environment has both); the values are drawn on
the GPU when there is one."""

from __future__ import annotations

import json
import math
import os


def tensor_names(path: str) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors and shapes as the checkpoint ships them (a ...ForConditional-
    Generation's language model under model.language_model.*, as vLLM loads it)."""
    from vllmx.models.registry import get_model_class

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    shapes = get_model_class(cfg).checkpoint_shapes(cfg)
    if "text_config" in cfg:
        shapes = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): s
                  for n, s in shapes.items()}
    return shapes


def write_random_weights(path: str, shard_bytes: int = 4 << 30, seed: int = 0) -> float:
    """Writes model-0000i-of-0000n.safetensors + the index into path; returns the GB written."""
    import torch
    from safetensors.torch import save_file

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(seed)
    shapes = tensor_names(path)
    shards, cur, size = [], {}, 0
    for name, shape in shapes.items():
        nbytes = 2 * math.prod(shape)
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name], size = shape, size + nbytes
    shards.append(cur)
    index, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard.items():
            if len(shape) == 1 and name.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.bfloat16, device=dev)
            elif len(shape) == 1:  # biases, A_log, dt_bias, choice biases
                t = torch.zeros(shape, dtype=torch.bfloat16, device=dev)
            else:
                t = torch.empty(shape, dtype=torch.bfloat16, device=dev).normal_(0, 0.02,
                                                                                generator=g)
            tensors[name] = t.cpu()
            index[name] = fname
            total += t.numel() * 2
        save_file(tensors, os.path.join(path, fname), metadata={"format": "pt"})
        del tensors
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": index}, f)
    return total / 1e9
