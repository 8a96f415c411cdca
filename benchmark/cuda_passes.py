"""The torch model alone on the passes the service plans (4,096 short or medium texts), in fp32 and
fp16, with SDPA or eager attention, sequence lengths as planned or padded to a multiple of 8: texts
per second after two warm-up rounds over the same shapes, median of 5. Each pass's rows are copied
back to the host, as the worker does.

Then passes of shapes the model has not yet seen (each pass one to three columns wider than in any
earlier round), with SDPA (torch's cuDNN attention allowed and not) and with eager attention: a
server's passes rarely repeat a shape, and cuDNN's attention builds a plan for each new one
(encoder_server.model.torch_backend.without_per_shape_attention_plans).

Then one short text per pass, as a batch-1 request runs: milliseconds per pass.

Last, the torch backend as a worker runs it, with and without CUDA graphs (model.cuda_graphs): the
planned passes, and the same texts cut as on the CPU (texts per second), and one short text per
pass (milliseconds, p50 and p90).

    DEVICE=cuda python -m benchmark.cuda_passes MODEL_FOLDER [--count 4096] [--only warmed unseen single graphs]

Measured on H200s on 2026-11-27 with the bundled model: README, "Compute" (CUDA).
"""
import argparse
import json
import os
import statistics
import time
from dataclasses import replace

import numpy as np
import torch

from encoder_server.model.passes import PASS_COST_TOKENS, Pass, pass_cost_tokens, plan_passes
from encoder_server.model.spec import ModelSpec, resolve_spec
from encoder_server.model.tokenizer import Tokenizer
from encoder_server.model.torch_backend import load_on_device, without_per_shape_attention_plans

from .corpus import texts as corpus

DEVICE = os.environ.get("DEVICE", "cuda")
COUNT = 4096
SINGLE_TEXTS = 200
MEASURES = ("warmed", "unseen", "single", "graphs")


def padded_to_8(inputs):
    return widened(inputs, -(-inputs.input_ids.shape[1] // 8) * 8 - inputs.input_ids.shape[1])


def widened(inputs, columns):
    """The same pass with `columns` more of padding."""
    def grow(array):
        return np.pad(array, ((0, 0), (0, columns)))
    return Pass(grow(inputs.input_ids), grow(inputs.attention_mask), grow(inputs.pool_mask),
                grow(inputs.token_type_ids))


def run(model, passes):
    with torch.inference_mode():
        for inputs in passes:
            model(*(torch.from_numpy(getattr(inputs, name)).to(DEVICE) for name in model.input_names)).float().cpu()


def seconds(model, passes):
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    run(model, passes)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def texts_per_second(model, passes, count):
    run(model, passes)
    run(model, passes)
    return round(count / statistics.median(seconds(model, passes) for _ in range(5)))


def unseen_shapes_texts_per_second(model, passes, count, rounds=3):
    """Texts/s over passes each of a width this model has not run yet, after a warm-up on others."""
    run(model, passes)
    return round(count / statistics.median(seconds(model, [widened(inputs, step) for inputs in passes])
                                           for step in range(1, rounds + 1)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--count", type=int, default=COUNT, help="texts of each kind")
    parser.add_argument("--only", nargs="+", choices=MEASURES, default=list(MEASURES),
                        help="warmed: passes as planned, warmed up; unseen: passes of unseen shapes (cuda); "
                             "single: one short text per pass; graphs: the backend with and without CUDA graphs")
    args = parser.parse_args(argv)
    results = {}
    for kind in ("short", "medium"):
        texts = corpus(kind, args.count, seed=5)
        for fp16 in (False, True):
            spec = resolve_spec(ModelSpec(model=args.model, device=DEVICE, fp16=fp16 and DEVICE == "cuda"))
            tokenizer = Tokenizer.for_spec(spec)
            encoding = tokenizer.tokenize(texts)
            planned = [inputs for _, inputs in plan_passes(encoding, spec.max_batch_tokens, 256, tokenizer.pad_id,
                                                           pass_cost_tokens(DEVICE))]
            if "warmed" in args.only:
                results.update(warmed_up(kind, fp16, spec, planned, len(texts)))
            if "unseen" in args.only and DEVICE == "cuda":
                results.update(unseen_shapes(kind, fp16, spec, planned, len(texts)))
            if "single" in args.only and kind == "short":
                results.update(one_text_passes(fp16, spec, tokenizer, texts[:SINGLE_TEXTS]))
            if "graphs" in args.only and DEVICE == "cuda":
                results.update(graphed(kind, fp16, spec, tokenizer, encoding, planned, texts))
    print(json.dumps(results, indent=1))


def warmed_up(kind, fp16, spec, planned, count):
    """SDPA and eager attention on the planned passes, as planned and padded to a multiple of 8."""
    results = {}
    for attention in ("sdpa", "eager"):
        model = load_on_device(spec, attention)
        for padded in (False, True):
            passes = [padded_to_8(inputs) for inputs in planned] if padded else planned
            key = f"{kind} {'fp16' if fp16 else 'fp32'} {attention} {'pad8' if padded else 'planned'}"
            results[key] = texts_per_second(model, passes, count)
            print(key, results[key], "texts/s,", len(passes), "passes", flush=True)
    return results


def unseen_shapes(kind, fp16, spec, planned, count):
    """Passes of unseen shapes with SDPA, torch's cuDNN attention allowed and not, and with eager
    attention (which has no per-shape plans either)."""
    results = {}
    for attention, cudnn in (("sdpa", True), ("sdpa", False), ("eager", False)):
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        model = load_on_device(spec, attention)
        key = f"{kind} {'fp16' if fp16 else 'fp32'} {attention} unseen shapes" + (
            f", cudnn attention {'on' if cudnn else 'off'}" if attention == "sdpa" else "")
        results[key] = unseen_shapes_texts_per_second(model, planned, count)
        print(key, results[key], "texts/s,", len(planned), "passes", flush=True)
    torch.backends.cuda.enable_cudnn_sdp(True)
    return results


def one_text_passes(fp16, spec, tokenizer, texts):
    """Milliseconds per pass of one text, p50 and p90, SDPA (without cuDNN attention, as a CUDA worker
    runs it) and eager, after a round over the same texts: the model's share of a batch-1 request."""
    without_per_shape_attention_plans()
    passes = [inputs for text in texts
              for _, inputs in plan_passes(tokenizer.tokenize([text]), spec.max_batch_tokens, 1)]
    results = {}
    for attention in ("sdpa", "eager"):
        model = load_on_device(spec, attention)
        run(model, passes)
        times = sorted(seconds(model, [inputs]) for inputs in passes)
        key = f"one short text per pass, {'fp16' if fp16 else 'fp32'} {attention}, p50 and p90 ms"
        results[key] = [round(1e3 * times[len(times) // 2], 2), round(1e3 * times[len(times) * 9 // 10], 2)]
        print(key, results[key], flush=True)
    torch.backends.cuda.enable_cudnn_sdp(True)
    return results


def graphed(kind, fp16, spec, tokenizer, encoding, planned, texts):
    """The planned passes, the same texts cut as on the CPU (by length, a pass costing 16 tokens),
    and for short texts one text per pass, through the torch backend with and without CUDA graphs
    (model.cuda_graphs), after a round over the same passes."""
    from encoder_server.model.torch_backend import TorchBackend
    cut_as_on_cpu = [inputs for _, inputs in plan_passes(encoding, spec.max_batch_tokens, 256, tokenizer.pad_id,
                                                         PASS_COST_TOKENS)]
    passes = {"planned": planned, "planned, cut as on the CPU": cut_as_on_cpu}
    if kind == "short":
        passes["one text"] = [inputs for text in texts[:SINGLE_TEXTS]
                              for _, inputs in plan_passes(tokenizer.tokenize([text]), spec.max_batch_tokens, 1)]
    results = {}
    for graphs in (False, True):
        backend = TorchBackend(replace(spec, cuda_graphs=graphs))
        for name, runs in passes.items():
            for inputs in runs:
                backend.run(inputs)
            times = []
            for inputs in runs:
                started = time.perf_counter()
                backend.run(inputs)
                times.append(time.perf_counter() - started)
            key = f"{kind} {'fp16' if fp16 else 'fp32'} {name}, {'CUDA graphs' if graphs else 'eager'}"
            p90 = sorted(times)[len(times) * 9 // 10]
            per_text = name.startswith("planned")
            results[key] = (round(len(texts) / sum(times)) if per_text else
                            [round(1e3 * statistics.median(times), 2), round(1e3 * p90, 2)])
            print(key, results[key], "texts/s" if per_text else "p50 and p90 ms a pass", flush=True)
    return results


if __name__ == "__main__":
    main()
