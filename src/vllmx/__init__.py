"""vllmx: vLLM's interface with native hot paths and no PyTorch at run time."""

import logging as _logging

# Like vLLM: INFO messages (model load, KV cache size) go to stderr unless the application
# configured logging for "vllmx" itself.
_logger = _logging.getLogger("vllmx")
if not _logger.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("%(levelname)s %(asctime)s vllmx: %(message)s",
                                             "%m-%d %H:%M:%S"))
    _logger.addHandler(_handler)
    _logger.setLevel(_logging.INFO)
    _logger.propagate = False

from vllmx.llm import LLM  # noqa: E402
from vllmx.outputs import (  # noqa: E402
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from vllmx.pooling_params import PoolingParams  # noqa: E402
from vllmx.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams  # noqa: E402

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "RequestOutput", "CompletionOutput", "RequestOutputKind",
           "PoolingParams", "PoolingOutput", "PoolingRequestOutput", "EmbeddingOutput",
           "EmbeddingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput",
           "ScoringOutput", "ScoringRequestOutput", "__version__"]
