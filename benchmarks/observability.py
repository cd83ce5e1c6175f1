"""What tracing and metrics cost a call (issue 49), in ONE run on the host backend:

    python benchmarks/observability.py [CALLS] [--rounds N]

Two contenders, alternated in blocks of ``CALLS`` ``bash true`` calls on one session each:
``off`` (no telemetry: the session only counts, and OpenTelemetry is not on the call's path)
and ``traced`` (``toolseam.instrument`` with the SDK's TracerProvider + BatchSpanProcessor +
OTLP/HTTP span exporter and a MeterProvider whose periodic reader exports over OTLP/HTTP —
both to a receiver on 127.0.0.1 that decodes what it gets, as a collector would). Also the
``off`` hook's own cost, timed alone (the observer around an already-finished coroutine).
Prints p50 per call and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import toolseam
from toolseam import Toolkit, ToolResult
from toolseam.builtins import CallContext
from toolseam.observability import SessionObserver
from toolseam.seam.models import JobStatus

_RECEIVER = """
import signal, sys, threading
from tests.support.otlp_receiver import otlp_receiver
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
with otlp_receiver() as r:
    print(r.endpoint, r.token, flush=True)
    done.wait()
    print(len(r.spans), flush=True)
"""


async def block(base: str, calls: int) -> list[float]:
    times = []
    async with Toolkit("host", base_dir=base) as tk:
        await tk.call("bash", {"command": "true"})  # warm
        for _ in range(calls):
            started = time.perf_counter()
            await tk.call("bash", {"command": "true"})
            times.append(time.perf_counter() - started)
    return times


def _ctx() -> CallContext:
    """A bash call's context as the hook sees it after the call: its job's status noted."""
    status = JobStatus(job="j", pid=1, state="exited", exit_code=0, timed_out=False,
                       killed=False, killed_tree=None, leftovers_killed=0, started=time.time(),
                       duration_ms=1, chunks=[], stdout_bytes=0, stderr_bytes=0,
                       stdout_truncated=False, stderr_truncated=False, cpu_seconds=0.001)
    ctx = CallContext(None, "/", False, "bench", "call-1", None)  # type: ignore[arg-type]
    ctx.extra["job"] = status
    return ctx


async def hook_alone(n: int, flush: Callable[[], object] = lambda: None
                     ) -> tuple[float, float]:
    """The hook's own CPU per call (best of 5 runs of ``n``): the observer around an
    already-finished coroutine, minus that coroutine alone — on the call's path (until the
    result is the caller's), and in all (with the work it leaves to the loop, decision 392)."""
    observer = SessionObserver("bench", "host")
    result = ToolResult(output="")
    ctx = _ctx()

    async def done() -> ToolResult:
        return result

    best_path = best_all = float("inf")
    for _ in range(5):  # this thread's CPU time: what the call's path pays, load or not
        flush()  # the exporter's queue empty: no span dropped (a drop is logged, and slow)
        started = time.thread_time()
        for _ in range(n):
            await observer.call("bash", ctx, {}, done())
        on_path = time.thread_time() - started
        await asyncio.sleep(0)  # the loop runs what the calls left it
        in_all = time.thread_time() - started
        started = time.thread_time()
        for _ in range(n):
            await done()
        alone = time.thread_time() - started
        best_path = min(best_path, (on_path - alone) / n)
        best_all = min(best_all, (in_all - alone) / n)
    return best_path, best_all


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("calls", nargs="?", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    base = tempfile.mkdtemp()
    off: list[float] = []
    traced: list[float] = []
    # the receiver in a process of its own, as a collector is: its decoding is not the calls'
    receiver = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE,
                                text=True, cwd=Path(__file__).resolve().parents[1])
    assert receiver.stdout is not None
    endpoint, token = receiver.stdout.readline().split()
    headers = {"authorization": f"Bearer {token}"}
    try:
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=f"{endpoint}/v1/traces", headers=headers)))
        meter_provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics",
                               headers=headers), export_interval_millis=1000)])
        for _ in range(args.rounds):
            toolseam.uninstrument()
            off += asyncio.run(block(base, args.calls))
            toolseam.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
            traced += asyncio.run(block(base, args.calls))
        hook_traced = asyncio.run(hook_alone(  # instrumented: spans, a histogram
            500, tracer_provider.force_flush))
        toolseam.uninstrument()
        hook, _ = asyncio.run(hook_alone(100_000))
        tracer_provider.shutdown()
        meter_provider.shutdown()
    finally:
        receiver.stdin = None
        receiver.terminate()
        spans_line = receiver.communicate(timeout=30)[0].strip()
    spans = int(spans_line) if spans_line.isdigit() else -1
    p_off, p_traced = statistics.median(off), statistics.median(traced)
    print(f"bash true, host, {args.rounds} x {args.calls} calls each, alternated:")
    print(f"  off     p50 {p_off * 1e6:8.0f} µs")
    print(f"  traced  p50 {p_traced * 1e6:8.0f} µs   (+{(p_traced - p_off) * 1e6:.0f} µs, "
          f"{(p_traced / p_off - 1) * 100:+.1f} %)  spans received: {spans}")
    print(f"  the hook alone, off:    {hook * 1e6:6.2f} µs a call "
          f"({hook / p_off * 100:.3f} % of an off call)")
    on_path, in_all = hook_traced
    print(f"  the hook alone, traced: {on_path * 1e6:6.2f} µs a call on the call's path "
          f"({on_path / p_off * 100:.2f} % of an off call), {in_all * 1e6:6.2f} µs in all "
          f"({in_all / p_off * 100:.2f} %; two spans, one histogram point)")


if __name__ == "__main__":
    main()
