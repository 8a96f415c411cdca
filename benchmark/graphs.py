"""The graph screen: every ONNX variant we considered, timed on one worker's thread and compared
with the fp32 export, on the same passes the service would cut. It is how the served graph and
the int8 recipe were chosen."""
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from encoder_server.model import onnx_export
from encoder_server.model.quantization_check import row_cosine


def _recipe(**changes):
    """The served int8 recipe with some settings changed."""
    return {**onnx_export.INT8_RECIPE, **changes}


def variants(fp32_file, model_config, settings):
    """(name, builder) pairs; a builder writes its graph to the given path. The int8 variants
    change one thing in the served recipe."""
    import onnx
    ffn_out = [node.name for node in onnx.load(str(fp32_file)).graph.node if node.op_type == "MatMul"
               and node.name.endswith("/output/dense/MatMul") and "attention" not in node.name]
    return [
        ("fp32 (served)", None),
        ("fp32 + ORT transformer fusions", lambda f, t: _fused(f, t, model_config)),
        ("int8 signed, per channel, smoothed, layer 0's FFN output fp32 (served with --quantize int8)",
         lambda f, t: onnx_export.quantize(f, t, settings)),
        ("int8, not smoothed, every MatMul int8",
         lambda f, t: onnx_export.quantize(f, t, settings, _recipe(smooth=(), exclude=()))),
        ("int8, every MatMul int8 (smoothed)", lambda f, t: onnx_export.quantize(f, t, settings, _recipe(exclude=()))),
        ("int8, per tensor", lambda f, t: onnx_export.quantize(f, t, settings, _recipe(per_channel=False))),
        ("int8, unsigned", lambda f, t: onnx_export.quantize(f, t, settings, _recipe(weight_type="QUInt8"))),
        ("int8, reduce_range", lambda f, t: onnx_export.quantize(f, t, settings, _recipe(reduce_range=True))),
        ("int8, not smoothed, every FFN output MatMul fp32",
         lambda f, t: onnx_export.quantize(f, t, settings, _recipe(smooth=(), exclude=tuple(ffn_out)))),
    ]


def _fused(source, target, config):
    """ONNX Runtime's offline BERT fusions: Attention, SkipLayerNormalization, BiasGelu."""
    from onnxruntime.transformers.optimizer import optimize_model
    fused = optimize_model(str(source), model_type="bert", num_heads=config.num_attention_heads,
                           hidden_size=config.hidden_size, opt_level=0)
    fused.save_model_to_file(str(target))


def screen(fp32_file, model_config, passes_by_kind, repeats, settings):
    """Rows of {variant, kind, sentences_per_s, min_cosine, mean_cosine}, on one thread like one worker."""
    reference = {kind: _run(_session(fp32_file), passes) for kind, passes in passes_by_kind.items()}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for index, (name, build) in enumerate(variants(fp32_file, model_config, settings)):
            path = fp32_file
            if build is not None:
                path = Path(folder) / f"variant-{index}.onnx"
                build(fp32_file, path)
            session = _session(path)
            for kind, passes in passes_by_kind.items():
                cosine = row_cosine(reference[kind], _run(session, passes))
                rows.append({"variant": name, "kind": kind, "sentences_per_s": _rate(session, passes, repeats),
                             "min_cosine": float(cosine.min()), "mean_cosine": float(cosine.mean())})
                print(rows[-1], flush=True)
    return rows


def _session(path):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session, passes):
    names = [node.name for node in session.get_inputs()]
    return np.concatenate([session.run(None, {name: getattr(batch, name) for name in names})[0] for batch in passes])


def _rate(session, passes, repeats):
    rows = sum(len(batch) for batch in passes)
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        _run(session, passes)
        rates.append(rows / (time.perf_counter() - started))
    return round(statistics.median(rates), 1)
