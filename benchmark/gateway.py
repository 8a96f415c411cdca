"""What does HTTP cost? One server with its built-in gateway, driven in turns by the ZeroMQ client
and by HTTP clients of the gateway, on the same texts.

    python -m benchmark.gateway                   # bundled all-MiniLM-L6-v2
    python -m benchmark.gateway --model DIR --texts 2000 --rounds 4

Clients: `EncoderClient` (ZeroMQ, the baseline), the official `openai` SDK asking for `float` and
for `base64` (its default), and bert-as-service's `POST /encode` (httpx). Two loads, each measured
for every client in every round, the clients in turn (each round in the other order): one client
sending `--texts` medium texts in requests of `--batch`, one after another; and `--clients`
closed-loop clients sending `--small-batch` texts each for `--seconds`. Prints the medians over the
rounds, each client's ratio to ZeroMQ's median in the same run and, for the sequential load, the CPU
time the client's own process spends per request (reading the reply, mostly): on a machine this
small it is taken from the workers.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from . import corpus, load
from .engines import Service, free_port

ZEROMQ = "ZeroMQ EncoderClient"  # the baseline: the server itself, through its own client


class OpenAiSdk:
    def __init__(self, url, model, encoding_format):
        self.name = f"HTTP, openai SDK, {encoding_format}"
        self.url, self.model, self.encoding_format = url, model, encoding_format

    def client(self):
        import openai

        sdk = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=900)

        class Client:
            def encode(_, texts):
                reply = sdk.embeddings.create(model=self.model, input=texts, encoding_format=self.encoding_format)
                assert len(reply.data) == len(texts)

            def close(_):
                sdk.close()

        return Client()


class BertEncode:
    name = "HTTP, POST /encode"

    def __init__(self, url):
        self.url = url

    def client(self):
        import httpx

        session = httpx.Client(base_url=self.url, timeout=900)

        class Client:
            def encode(_, texts):
                reply = session.post("/encode", json={"id": 1, "texts": texts})
                reply.raise_for_status()
                assert len(reply.json()["result"]) == len(texts)

            def close(_):
                session.close()

        return Client()


class CpuTimed:
    """An engine whose clients note the CPU time this process spends in each encode."""

    def __init__(self, engine, spent):
        self.engine, self.spent = engine, spent

    def client(self):
        client, spent = self.engine.client(), self.spent

        class Client:
            def encode(_, texts):
                started = time.process_time()
                client.encode(texts)
                spent.append(time.process_time() - started)

            def close(_):
                client.close()

        return Client()


def sequential(engine, texts, batch):
    spent = []
    result = load.sequential(CpuTimed(engine, spent), texts, batch, 0)
    return {**result, "client_cpu_ms": round(statistics.median(spent[1:]) * 1000, 1)}  # [0]: the warm-up


def wait_gateway(url, timeout=60):
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return httpx.get(f"{url}/v1/models", timeout=2).json()["data"][0]["id"]
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {url} was not ready within {timeout}s")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--kind", choices=sorted(corpus.WORDS), default="medium", help="text length")
    parser.add_argument("--texts", type=int, default=2000, help="texts per sequential measurement")
    parser.add_argument("--batch", type=int, default=256, help="texts per request, sequential load")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients, closed-loop load")
    parser.add_argument("--small-batch", type=int, default=16, help="texts per request, closed-loop load")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window of each closed-loop run")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds; every client is measured once per round (an even number cancels a steady drift)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    texts = corpus.texts(args.kind, args.texts)
    http_port = free_port()
    url = f"http://127.0.0.1:{http_port}"
    loads = {f"1 client, {args.batch} texts per request":
             lambda engine: sequential(engine, texts, args.batch),
             f"{args.clients} clients, {args.small_batch} texts per request":
             lambda engine: load.closed_loop(engine, texts, args.clients, args.small_batch, args.seconds, 0)}
    runs = {}
    with Service(ZEROMQ, ["--http-port", str(http_port)], model=args.model) as service:
        model = wait_gateway(url)
        engines = [service, OpenAiSdk(url, model, "float"), OpenAiSdk(url, model, "base64"), BertEncode(url)]
        for round_, turn in enumerate(load.turn_orders(engines, args.rounds), 1):
            for load_name, measure in loads.items():
                for engine in turn:
                    result = measure(engine)
                    runs.setdefault((load_name, engine.name), []).append(result)
                    print(f"round {round_}, {load_name}, {engine.name}: {result['sentences_per_s']} sent./s, "
                          f"p95 {result['p95_ms']} ms", flush=True)

    print(f"\n{args.kind} texts, {args.rounds} rounds, medians; ratio = sentences/s against ZeroMQ in the same run\n")
    print("| load | client | sentences/s | ratio | p50 ms | p95 ms | client CPU ms per request |")
    print("|---|---|---:|---:|---:|---:|---:|")
    table = []
    for load_name in loads:
        baseline = statistics.median(r["sentences_per_s"] for r in runs[load_name, ZEROMQ])
        for engine in engines:
            median = load.median_of(runs[load_name, engine.name])
            ratio = round(median["sentences_per_s"] / baseline, 2)
            table.append({"load": load_name, "client": engine.name, **median, "ratio": ratio})
            print(f"| {load_name} | {engine.name} | {median['sentences_per_s']} | {ratio:.2f} | "
                  f"{median['p50_ms']} | {median['p95_ms']} | {median.get('client_cpu_ms', '–')} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": table, "kind": args.kind, "rounds": args.rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
