"""`vllmx serve` with an injected engine fault (a test hook for test_serve_process): the
batched step that schedules a request with seed FATAL_SEED raises, which no request-level
boundary can contain, so the engine loop dies."""

from __future__ import annotations

import sys

from vllmx.cli.main import main
from vllmx.worker.model_runner import ModelRunner

FATAL_SEED = 6660666
_execute_model = ModelRunner.execute_model


def execute_model(self, so):
    if any(new.sampling_params.seed == FATAL_SEED for new in so.scheduled_new_reqs):
        raise RuntimeError("injected engine fault")
    return _execute_model(self, so)


if __name__ == "__main__":
    ModelRunner.execute_model = execute_model
    sys.exit(main())
