"""vllmx: vLLM's interface with native hot paths and no PyTorch at run time."""

from vllmx.llm import LLM
from vllmx.outputs import CompletionOutput, RequestOutput
from vllmx.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestOutputKind",
           "__version__"]
