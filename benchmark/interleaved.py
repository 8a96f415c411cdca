"""One text at a time, alternately in-process and through the service, so that both meet the same
moments of a shared host: what the service adds to a lone request, apart from what the host does
to both.

    python -m benchmark.interleaved [--kind long] [--texts 300] [--int8] [--model FOLDER]

Separate runs of the two (the `latency` and `client_batches` scenarios) put them minutes apart, and
on a VM whose speed drifts by tens of percent within minutes, a tail seen in one run and not the
other may be the host's. Here each text goes first to our Embedder in this process, with the threads
the service gives a lone pass (`cpus.lone_lane_threads`), and then to the service as a request of
one text; it prints the p50, p95 and p99 of each, p95 / p50, and the percentiles of each text's
difference. (Each engine then starts cold, just after the other: for short texts this adds to the
difference what a lone request meets after an idle moment.)
"""
import argparse
import json
import time

import numpy as np

from . import corpus, engines


def measure(kind="long", count=300, int8=False, model=None, warmup=10):
    """{engine: {requests, p50_ms, p95_ms, p99_ms, p95_over_p50}, "service - in-process": {p50_ms, p95_ms}}."""
    from encoder_server.model.cpus import lone_lane_threads
    from encoder_server.settings import resolve

    quantize = {"quantize": "int8"} if int8 else {}
    settings = resolve(model=model, num_worker=1, threads_per_worker=lone_lane_threads(), **quantize)
    in_process = engines.our_backend(settings)
    texts = corpus.texts(kind, count + warmup)
    latencies = {"in-process": [], "service": []}
    with engines.Service("service", ("--quantize", "int8") if int8 else (), model) as service:
        client = service.client()
        try:
            for index, text in enumerate(texts):
                for name, engine in (("in-process", in_process), ("service", client)):
                    started = time.perf_counter()
                    engine.encode([text])
                    if index >= warmup:
                        latencies[name].append((time.perf_counter() - started) * 1000)
        finally:
            client.close()
    result = {name: _percentiles(values) for name, values in latencies.items()}
    difference = np.subtract(latencies["service"], latencies["in-process"])
    result["service - in-process"] = {f"p{q}_ms": round(float(np.percentile(difference, q)), 2) for q in (50, 95)}
    return result


def _percentiles(values):
    p50, p95, p99 = (float(np.percentile(values, q)) for q in (50, 95, 99))
    return {"requests": len(values), "p50_ms": round(p50, 2), "p95_ms": round(p95, 2), "p99_ms": round(p99, 2),
            "p95_over_p50": round(p95 / p50, 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", default="long", choices=sorted(corpus.WORDS))
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--int8", action="store_true", help="both engines quantized to int8")
    parser.add_argument("--model", help="model folder (default: the bundled model)")
    args = parser.parse_args(argv)
    if args.texts < 1:
        parser.error("--texts must be at least 1")
    print(json.dumps({"kind": args.kind, "texts": args.texts, "int8": args.int8,
                      **measure(args.kind, args.texts, args.int8, args.model)}, indent=1))


if __name__ == "__main__":
    main()
