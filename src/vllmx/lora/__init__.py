"""LoRA adapters (vLLM's vllm/lora): PEFT checkpoints loaded per request (request.py,
models.py), applied to a Llama-family model's q/k/v/o and MLP projections in batches that mix
adapters and the base model (layers.py, punica.py), kept by LoRAModelManager
(model_manager.py)."""
