"""Prometheus metrics with vLLM's names, prefix `vllm:` and label model_name as in vLLM (so the
dashboards and alerts people run for vLLM read them unchanged), and the periodic one-line
stats log. Scheduler state (running / waiting / KV usage / preemptions / prefix cache)
is read from the engine at scrape time; per-request metrics are recorded as outputs stream
through the server (`track`). Each app has its own CollectorRegistry."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from vllmx.core.scheduler import ITERATION_TOKEN_BUCKETS
from vllmx.engine.exceptions import EngineDeadError, EngineGenerateError
from vllmx.outputs import RequestOutput
from vllmx.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger("vllmx")

_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_N_BUCKETS = [1, 2, 5, 10, 20]
FINISH_REASONS = ("stop", "length", "abort", "error")

# vLLM's deprecated metrics: name -> (the replacement whose values it repeats, the vLLM version
# that hid it). vLLM shows a hidden metric for one release more when
# --show-hidden-metrics-for-version names its previous minor version; vllmx, not versioned as
# vLLM is, shows each for any version before the one that hid it (what a vLLM server of that
# version served): "0.10" (vLLM 0.11's value) all four, "0.11" (vLLM 0.12's) the last one,
# "0.0" (vLLM's rule on vllmx 0.1.x's own version) all four. None is shown by default.
HIDDEN_METRICS = {
    "vllm:gpu_cache_usage_perc": ("vllm:kv_cache_usage_perc", (0, 11)),
    "vllm:gpu_prefix_cache_queries": ("vllm:prefix_cache_queries", (0, 11)),
    "vllm:gpu_prefix_cache_hits": ("vllm:prefix_cache_hits", (0, 11)),
    "vllm:time_per_output_token_seconds": ("vllm:inter_token_latency_seconds", (0, 12)),
}


def shown_hidden_metrics(version: tuple[int, int] | None) -> set[str]:
    """The names of HIDDEN_METRICS that --show-hidden-metrics-for-version (major, minor)
    shows: those vLLM hid only after that version."""
    if version is None:
        return set()
    shown = {name for name, (_, hidden_in) in HIDDEN_METRICS.items() if version < hidden_in}
    if not shown:
        logger.warning("--show-hidden-metrics-for-version %d.%d shows no metric: vllmx's hidden "
                       "metrics are %s, shown for versions before the one that hid each",
                       *version, ", ".join(f"{n} (hidden in vLLM {'.'.join(map(str, v))})"
                                           for n, (_, v) in HIDDEN_METRICS.items()))
    return shown


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's buckets for token counts)."""
    buckets, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exponent
            if v > max_value:
                return buckets
            buckets.append(v)
        exponent += 1

disable_created_metrics()  # no *_created series, as vLLM


class _SchedulerCollector:
    """Gauges and counters that the scheduler keeps, read when /metrics is scraped."""

    def __init__(self, engine_client, model_name: str, hidden: set[str]):
        self.engine_client = engine_client
        self.model_name = model_name
        # replacement -> the hidden metric shown beside it, with its values
        self.deprecated_names = {new: old for old, (new, _) in HIDDEN_METRICS.items()
                                 if old in hidden}

    def _family(self, kind, name: str, doc: str, value: float):
        f = kind(f"vllm:{name}", doc, labels=["model_name"])
        f.add_metric([self.model_name], value)
        yield f
        old = self.deprecated_names.get(f"vllm:{name}")
        if old is not None:
            f = kind(old, f"{doc} DEPRECATED: Use vllm:{name} instead.", labels=["model_name"])
            f.add_metric([self.model_name], value)
            yield f

    def collect(self):
        s = self.engine_client.get_scheduler_stats()
        labels = [self.model_name]
        h = HistogramMetricFamily("vllm:iteration_tokens_total",
                                  "Histogram of number of tokens per engine_step.",
                                  labels=["model_name"])
        bounds = [str(float(b)) for b in ITERATION_TOKEN_BUCKETS] + ["+Inf"]
        if s.iteration_tokens_buckets:
            h.add_metric(labels, list(zip(bounds, s.iteration_tokens_buckets)),
                         s.iteration_tokens_sum)
        yield h
        # vLLM's cache_config_info: the cache configuration as labels of a constant 1. Its
        # labels for what vllmx does not have say so: no KV offload or swap space (preemption
        # recomputes), no CPU blocks beside the cache's own, no cache-wide sliding window.
        cc = self.engine_client.vllm_config.cache_config
        info = {"block_size": cc.block_size, "cache_dtype": cc.kv_cache_dtype,
                "enable_prefix_caching": cc.enable_prefix_caching,
                "gpu_memory_utilization": cc.gpu_memory_utilization,
                "num_gpu_blocks": cc.num_blocks,
                "num_gpu_blocks_override": cc.num_gpu_blocks_override,
                "kv_cache_memory_bytes": cc.kv_cache_memory_bytes,
                "cpu_offload_gb": 0, "swap_space_bytes": 0, "num_cpu_blocks": None,
                "sliding_window": None}
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                              labels=list(info))
        g.add_metric([str(v) for v in info.values()], 1.0)
        yield g
        for name, doc, value in (
                ("num_requests_running", "Number of requests in model execution batches.",
                 s.num_running_reqs),
                ("num_requests_waiting", "Number of requests waiting to be processed.",
                 s.num_waiting_reqs),
                ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                 s.kv_cache_usage)):
            yield from self._family(GaugeMetricFamily, name, doc, value)
        # vLLM's split of the waiting requests: "capacity" (waiting for room in a step) and
        # "deferred" (set aside, out of order, by a transient constraint such as the LoRA
        # budget). vllmx sets none aside: a request whose adapter would exceed --max-loras
        # holds the queue in order, so every waiting request waits for capacity.
        g = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels=["model_name", "reason"])
        g.add_metric([self.model_name, "capacity"], s.num_waiting_reqs)
        g.add_metric([self.model_name, "deferred"], 0)
        yield g
        for name, doc, value in (
                ("prefix_cache_queries",
                 "Prefix cache queries, in terms of number of queried tokens.",
                 s.prefix_cache_queries),
                ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                 s.prefix_cache_hits),
                ("num_preemptions", "Cumulative number of preemption from the engine.",
                 s.num_preemptions),
                ("spec_decode_num_drafts", "Number of spec decoding drafts.",
                 s.spec_decode_num_drafts),
                ("spec_decode_num_draft_tokens", "Number of draft tokens.",
                 s.spec_decode_num_draft_tokens),
                ("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                 s.spec_decode_num_accepted_tokens)):
            yield from self._family(CounterMetricFamily, name, doc, value)


class _TokenCounter:
    """vllm:generation_tokens_total, the server's plain running count at scrape time."""

    def __init__(self, metrics: ServerMetrics, model_name: str):
        self.metrics = metrics
        self.model_name = model_name

    def collect(self):
        c = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.",
                                labels=["model_name"])
        c.add_metric([self.model_name], self.metrics.num_generation_tokens)
        yield c


class ServerMetrics:
    def __init__(self, engine_client, model_name: str):
        self.engine_client = engine_client
        self.model_name = model_name
        self.registry = CollectorRegistry()
        hidden = shown_hidden_metrics(
            engine_client.vllm_config.observability_config.show_hidden_metrics_minor)
        self.registry.register(_SchedulerCollector(engine_client, model_name, hidden))
        labels = ["model_name"]
        r = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels, registry=r).labels(model_name)
        # vllm:generation_tokens is read from num_generation_tokens when scraped (_TokenCounter):
        # a Counter's locked inc() for every streamed chunk cost the event loop ~2% under load.
        r.register(_TokenCounter(self, model_name))
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          ["model_name", "finished_reason"], registry=r)
        self.request_success = {f: success.labels(model_name, f) for f in FINISH_REASONS}
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", labels,
                              buckets=_TTFT_BUCKETS, registry=r).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", labels,
                             buckets=_ITL_BUCKETS, registry=r).labels(model_name)
        # vLLM's deprecated name for the same histogram: observed with it, when shown.
        self.tpot = None
        if "vllm:time_per_output_token_seconds" in hidden:
            self.tpot = Histogram("vllm:time_per_output_token_seconds",
                                  "Histogram of time per output token in seconds. DEPRECATED: "
                                  "Use vllm:inter_token_latency_seconds instead.", labels,
                                  buckets=_ITL_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", labels,
                             buckets=_LATENCY_BUCKETS, registry=r).labels(model_name)
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    labels, buckets=_LATENCY_BUCKETS, registry=r).labels(model_name)
        phases = {}
        for phase, doc in (("inference", "RUNNING"), ("prefill", "PREFILL"),
                           ("decode", "DECODE")):
            phases[phase] = Histogram(f"vllm:request_{phase}_time_seconds",
                                      f"Histogram of time spent in {doc} phase for request.",
                                      labels, buckets=_LATENCY_BUCKETS,
                                      registry=r).labels(model_name)
        self.inference_time, self.prefill_time, self.decode_time = (
            phases["inference"], phases["prefill"], phases["decode"])
        self.max_model_len = engine_client.model_config.max_model_len
        token_buckets = build_1_2_5_buckets(self.max_model_len)
        self.request_prompt_tokens = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels,
            buckets=token_buckets, registry=r).labels(model_name)
        self.request_generation_tokens = Histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", labels,
            buckets=token_buckets, registry=r).labels(model_name)
        self.request_params_n = Histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", labels,
            buckets=_N_BUCKETS, registry=r).labels(model_name)
        self.request_params_max_tokens = Histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            labels, buckets=token_buckets, registry=r).labels(model_name)
        # Plain totals for the periodic log.
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def track(self, outputs: AsyncIterator[RequestOutput], arrival_time: float,
                    params: SamplingParams | BeamSearchParams) -> AsyncIterator[RequestOutput]:
        """Passes a request's DELTA outputs through, recording its metrics on the way."""
        first, finished = True, False
        num_prompt_tokens = num_generated = 0
        itl_seen: dict[int, int] = {}  # per sample's RequestMetrics: its gaps observed so far
        try:
            async for out in outputs:
                now = time.time()
                if first:
                    first = False
                    num_prompt_tokens = len(out.prompt_token_ids)
                    self.prompt_tokens.inc(num_prompt_tokens)
                    self.num_prompt_tokens += num_prompt_tokens
                    self.ttft.observe(now - arrival_time)
                m = out.metrics
                if m is not None:  # the engine's per-step gaps, however outputs were merged
                    gaps = m.inter_token_latencies
                    for gap in gaps[itl_seen.get(id(m), 0):]:
                        self.itl.observe(gap)
                        if self.tpot is not None:
                            self.tpot.observe(gap)
                    itl_seen[id(m)] = len(gaps)
                for c in out.outputs:
                    k = len(c.token_ids)
                    if k:
                        num_generated += k
                        self.num_generation_tokens += k
                    if c.finish_reason in self.request_success:
                        self.request_success[c.finish_reason].inc()
                if out.finished:
                    finished = True
                    self.e2e.observe(now - arrival_time)
                    self._observe_finished(out, num_prompt_tokens, num_generated, params)
                yield out
        except (EngineGenerateError, EngineDeadError):
            finished = True  # counted as an error, not an abort
            self.request_success["error"].inc()
            raise
        finally:
            if not finished:  # the client went away, or the request was refused
                self.request_success["abort"].inc()
                await outputs.aclose()  # aborts the engine request now, not at GC


    def _observe_finished(self, out: RequestOutput, num_prompt_tokens: int, num_generated: int,
                          params: SamplingParams | BeamSearchParams) -> None:
        """vLLM's per-request histograms, once a request finishes."""
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_generated)
        self.request_params_n.observe(getattr(params, "n", None) or params.beam_width)
        # (vLLM's server always sets max_tokens: what the context leaves when unset.)
        self.request_params_max_tokens.observe(
            params.max_tokens if params.max_tokens is not None
            else self.max_model_len - num_prompt_tokens)
        m = out.metrics
        if m is None or not m.first_scheduled_time:
            return
        self.queue_time.observe(max(0.0, m.first_scheduled_time - m.arrival_time))
        end = m.finished_time or m.last_token_time or time.time()
        self.inference_time.observe(max(0.0, end - m.first_scheduled_time))
        if m.first_token_time:
            self.prefill_time.observe(max(0.0, m.first_token_time - m.first_scheduled_time))
            self.decode_time.observe(max(0.0, end - m.first_token_time))


class StatLogger:
    """vLLM's LoggingStatLogger: every interval, one line of throughput and cache usage
    (only while there is something to report)."""

    def __init__(self, metrics: ServerMetrics, interval: float = 10.0):
        self.metrics = metrics
        self.interval = interval
        self._last = (time.monotonic(), 0, 0, 0, 0)
        self._was_busy = False

    def log(self) -> str | None:
        m = self.metrics
        s = m.engine_client.get_scheduler_stats()
        now = time.monotonic()
        t0, p0, g0, q0, h0 = self._last
        dt = max(now - t0, 1e-9)
        prompt_tp = (m.num_prompt_tokens - p0) / dt
        gen_tp = (m.num_generation_tokens - g0) / dt
        dq, dh = s.prefix_cache_queries - q0, s.prefix_cache_hits - h0
        self._last = (now, m.num_prompt_tokens, m.num_generation_tokens, s.prefix_cache_queries,
                      s.prefix_cache_hits)
        busy = bool(prompt_tp or gen_tp or s.num_running_reqs or s.num_waiting_reqs)
        if not busy and not self._was_busy:
            return None
        self._was_busy = busy
        line = (f"Avg prompt throughput: {prompt_tp:.1f} tokens/s, Avg generation throughput: "
                f"{gen_tp:.1f} tokens/s, Running: {s.num_running_reqs} reqs, Waiting: "
                f"{s.num_waiting_reqs} reqs, KV cache usage: {100 * s.kv_cache_usage:.1f}%, "
                f"Prefix cache hit rate: "
                f"{100 * dh / dq if dq else 0.0:.1f}%")
        logger.info(line)
        return line

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.log()
            except Exception:  # a stats hiccup must never take the server down
                logger.exception("stats logging failed")
