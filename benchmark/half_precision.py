"""Which half precision `--fp16` should run: the model's rows in fp16 and in bf16 against its own
fp32 rows, min and mean row cosine over 256 short, medium and long texts, on the passes the service
plans. Pooling and the head stay float32, as in the server (encoder_server.model.torch_backend).

    python -m benchmark.half_precision [MODEL_FOLDER]     # DEVICE=cuda to run it on a GPU

Both halves run at the same tensor-core rate on an H100 or H200; they differ in what they keep:
fp16 has 10 bits of mantissa and a range up to 65,504, bf16 7 bits and fp32's range.
"""
import json
import os
import sys

import numpy as np
import torch

from encoder_server.model.model_folder import default_model_path
from encoder_server.model.passes import plan_passes
from encoder_server.model.pooled_model import load_model_module
from encoder_server.model.quantization_check import row_cosine
from encoder_server.model.spec import ModelSpec, resolve_spec
from encoder_server.model.tokenizer import Tokenizer

from .corpus import texts as corpus

DEVICE = os.environ.get("DEVICE", "cpu")
HALVES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def load(spec, dtype):
    """The model on DEVICE, its encoder in `dtype` (pooling and the head stay float32)."""
    model = load_model_module(spec, attention="eager").to(DEVICE)
    model.model.to(dtype)
    return model


def rows(model, spec, passes, count):
    out = np.zeros((count, spec.embedding_dim), np.float32)
    with torch.inference_mode():
        for group, inputs in passes:
            tensors = (torch.from_numpy(getattr(inputs, name)).to(DEVICE) for name in model.input_names)
            out[group] = model(*tensors).float().cpu().numpy()
    return out


def main():
    spec = resolve_spec(ModelSpec(model=sys.argv[1] if len(sys.argv) > 1 else str(default_model_path())))
    results = {"device": DEVICE, "torch": torch.__version__}
    reference_model, tokenizer = load(spec, torch.float32), Tokenizer.for_spec(spec)
    halves = {half: load(spec, dtype) for half, dtype in HALVES.items()}
    for kind in ("short", "medium", "long"):
        texts = corpus(kind, 256, seed=9)
        passes = plan_passes(tokenizer.tokenize(texts), spec.max_batch_tokens, 256)
        reference = rows(reference_model, spec, passes, len(texts))
        for half, model in halves.items():
            cosine = row_cosine(rows(model, spec, passes, len(texts)), reference)
            results[f"{kind} {half}"] = {"min_cosine": round(float(cosine.min()), 7),
                                         "mean_cosine": round(float(cosine.mean()), 7)}
            print(kind, half, results[f"{kind} {half}"], flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
