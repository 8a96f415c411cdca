"""The torch model alone on the passes the service plans (4,096 short or medium texts), in fp32 and
fp16, with SDPA or eager attention, sequence lengths as planned or padded to a multiple of 8: texts
per second after two warm-up rounds over the same shapes, median of 5. Each pass's rows are copied
back to the host, as the worker does.

    DEVICE=cuda python -m benchmark.cuda_passes MODEL_FOLDER

Measured on an H200 on 2026-11-27 with the bundled model: README, "Not yet".
"""
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

from encoder_server.model.passes import Pass, plan_passes
from encoder_server.model.pooled_model import load_model_module
from encoder_server.model.spec import ModelSpec, resolve_spec
from encoder_server.model.tokenizer import Tokenizer

from .corpus import texts as corpus

DEVICE = os.environ.get("DEVICE", "cuda")
COUNT = int(os.environ.get("COUNT", 4096))


def padded_to_8(inputs):
    width = -(-inputs.input_ids.shape[1] // 8) * 8

    def grow(array):
        return np.pad(array, ((0, 0), (0, width - array.shape[1])))
    return Pass(grow(inputs.input_ids), grow(inputs.attention_mask), grow(inputs.pool_mask),
                grow(inputs.token_type_ids))


def texts_per_second(model, passes, count):
    def run():
        with torch.inference_mode():
            for inputs in passes:
                model(*(torch.from_numpy(getattr(inputs, name)).to(DEVICE) for name in model.input_names)).float().cpu()

    def synchronize():
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    run()
    run()
    times = []
    for _ in range(5):
        synchronize()
        started = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - started)
    return round(count / statistics.median(times))


def main():
    results = {}
    for kind in ("short", "medium"):
        texts = corpus(kind, COUNT, seed=5)
        for fp16 in (False, True):
            spec = resolve_spec(ModelSpec(model=sys.argv[1], device=DEVICE, fp16=fp16 and DEVICE == "cuda"))
            planned = [inputs for _, inputs in plan_passes(Tokenizer.for_spec(spec).tokenize(texts),
                                                           spec.max_batch_tokens, 256)]
            for attention in ("sdpa", "eager"):
                model = load_model_module(spec, attention=attention).to(DEVICE)
                if fp16 and DEVICE == "cuda":
                    model.model.half()
                for padded in (False, True):
                    passes = [padded_to_8(inputs) for inputs in planned] if padded else planned
                    key = f"{kind} {'fp16' if fp16 else 'fp32'} {attention} {'pad8' if padded else 'planned'}"
                    results[key] = texts_per_second(model, passes, len(texts))
                    print(key, results[key], "texts/s,", len(passes), "passes", flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
