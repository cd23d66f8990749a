"""Tensor parallelism across processes (vLLM's vllm/distributed): the group a rank's layers
reduce over (parallel_state.py), its collectives over a host's shared memory on the CPU
(shm_comm.py), and a checkpoint cut into one rank's share (tp_shard.py)."""
