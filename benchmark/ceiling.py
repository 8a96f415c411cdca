"""What this CPU can do at most: ONNX Runtime's fp32 and int8 matrix products on the model's own
shapes, and the share of it that an engine's throughput uses.

A BERT layer is almost all matrix products: per token, 4·h² (the attention projections) plus
2·h·ffn (the feed-forward) multiply-adds, and 2·h·seq more for the attention scores and their
use. The ceiling is measured with ORT's MatMul (fp32) and MatMulInteger (the kernel the served
int8 runs on: uint8 × int8 where the CPU has VNNI, else uint8 × uint8, see
onnx_export.int8_recipe) on a [tokens, h] × [h, ffn] product, on one thread and on every core.
"""
import os
import time

import numpy as np

TOKENS = 4096       # rows of the product: about one full pass under the default token budget x 4
REPEAT_S = 1.5      # seconds each measurement runs for


def model_flops_per_token(hidden, ffn, layers, seq_len):
    """Floating-point operations (2 per multiply-add) one token costs in a pass of `seq_len` tokens."""
    return 2 * layers * (4 * hidden * hidden + 2 * hidden * ffn + 2 * hidden * seq_len)


def measure(hidden=384, ffn=1536):
    """{"fp32_gflops": {threads: GFLOP/s}, "int8_gops": {threads: GOP/s}} for 1 thread and every core."""
    cores = len(os.sched_getaffinity(0))
    results = {"fp32_gflops": {}, "int8_gops": {}}
    for threads in dict.fromkeys((1, cores)):
        results["fp32_gflops"][threads] = round(_rate(_product(hidden, ffn, int8=False), threads, hidden, ffn), 1)
        results["int8_gops"][threads] = round(_rate(_product(hidden, ffn, int8=True), threads, hidden, ffn), 1)
    return results


def share(texts_per_s, tokens_per_text, ceiling, hidden=384, ffn=1536, layers=6):
    """The fraction of `ceiling` (GFLOP/s or GOP/s) that embedding `texts_per_s` texts uses."""
    flops = texts_per_s * tokens_per_text * model_flops_per_token(hidden, ffn, layers, tokens_per_text)
    return round(flops / (ceiling * 1e9), 3)


def _product(hidden, ffn, int8):
    """A serialized one-node ONNX graph: x [TOKENS, hidden] times a constant weight [hidden, ffn]."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    if int8:
        from encoder_server.model.onnx_export import int8_recipe
        signed = int8_recipe()["weight_type"] == "QInt8"
        weight = numpy_helper.from_array(rng.integers(-127, 127, (hidden, ffn), dtype=np.int8) if signed else
                                         rng.integers(0, 255, (hidden, ffn), dtype=np.uint8), "w")
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
        x_type, y_type = TensorProto.UINT8, TensorProto.INT32
    else:
        weight = numpy_helper.from_array(rng.standard_normal((hidden, ffn), dtype=np.float32), "w")
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        x_type, y_type = TensorProto.FLOAT, TensorProto.FLOAT
    graph = helper.make_graph([node], "product", [helper.make_tensor_value_info("x", x_type, [TOKENS, hidden])],
                              [helper.make_tensor_value_info("y", y_type, [TOKENS, ffn])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _rate(model, threads, hidden, ffn):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    dtype = np.uint8 if session.get_inputs()[0].type == "tensor(uint8)" else np.float32
    x = (np.random.default_rng(1).random((TOKENS, hidden)) * 100).astype(dtype)
    session.run(None, {"x": x})
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < REPEAT_S:
        session.run(None, {"x": x})
        runs += 1
    return runs * 2 * TOKENS * hidden * ffn / (time.perf_counter() - started) / 1e9
