"""The per-request cost of recording metrics: ``Metrics.on_request`` timed with timeit.

    .venv/bin/python -m bench.metrics_cost            # this process's figures only
    .venv/bin/python -m bench.metrics_cost --shared   # multiprocess mode (a server's workers)
    .venv/bin/python -m bench.metrics_cost --otel     # also the OpenTelemetry instruments

Prints microseconds per call, the best of five runs of NUMBER calls.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import timeit

NUMBER = 100_000
ROUTES = ("POST /v1/transfers", "GET /v1/accounts/{account_id}", "GET /health")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", action="store_true", help="multiprocess mode")
    parser.add_argument("--otel", action="store_true", help="OTel SDK instruments beside")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrics-cost-") as shared:
        if args.shared:  # before prometheus_client is imported: it picks its mode then
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = shared
        from service.telemetry import Metrics

        kwargs: dict[str, object] = {"shared_dir": shared if args.shared else None}
        if args.otel:
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader

            kwargs["otel_readers"] = [InMemoryMetricReader()]
        metrics = Metrics(**kwargs)  # type: ignore[arg-type]
        answers = ((201, None, False), (200, None, True), (409, "x", False))
        calls = [(route, *answer) for route in ROUTES for answer in answers]

        def one_round() -> None:
            for route, status, problem, replayed in calls:
                metrics.on_request(route, status, problem, replayed, 0.003)

        runs = timeit.repeat(one_round, number=NUMBER // len(calls), repeat=5)
        per_call = min(runs) / (NUMBER // len(calls) * len(calls)) * 1e6
        mode = ("multiprocess" if args.shared else "in-process") + (" + otel" if args.otel else "")
        print(f"on_request, {mode}: {per_call:.2f} us per call")


if __name__ == "__main__":
    main()
