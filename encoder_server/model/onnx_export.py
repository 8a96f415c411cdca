"""Build the ONNX files the onnx backend runs: export the pooled encoder (with the model's Dense and
LayerNorm head), then optionally quantize it to int8 or convert it to fp16. Each file keeps its
weights in `<file>.data` beside it (see model_cache).

ONNX Runtime's offline transformer fusions (Attention, SkipLayerNormalization) are not applied:
they kept the row cosine at 0.9999999 but ran 1-12% slower on the CPUs measured than the session's
own optimizations (`python -m benchmark.run --only graphs`)."""
import re
import warnings

from .cpus import has_vnni

OPSET = 17
OUTPUT_NAME = "embeddings"


def export(spec, path):
    """The served torch module (pooled_model.load_model_module) as fp32 ONNX with dynamic batch and
    sequence axes."""
    import torch

    from .pooled_model import load_model_module

    module = load_model_module(spec, attention="eager")
    ids = torch.tensor([[2, 5, 6, 3], [2, 5, 3, 0]], dtype=torch.int64)
    sample = {"input_ids": ids,
              "attention_mask": (ids != 0).to(torch.int64),  # padding in the sample, so the graph keeps the mask
              "pool_mask": torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.int64),
              "token_type_ids": torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0]], dtype=torch.int64)}
    names = list(module.input_names)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[OUTPUT_NAME] = {0: "batch", 1: "sequence"} if spec.pooling.token_level else {0: "batch"}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes about branches that are constant for encoders
        # the TorchScript exporter: the dynamo one needs onnxscript and its graph optimizes less well
        torch.onnx.export(module, tuple(sample[name] for name in names), str(path), input_names=names,
                          output_names=[OUTPUT_NAME], dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    move_weights_out(path)


# The int8 recipe: signed per-channel weights on every MatMul, each MatMul's input smoothed first
# (smoothing.py: a channel above the median channel's max |x| on SAMPLE is divided by
# (max / median) ** 0.5 and its weight row multiplied by the same, so fp32 output is unchanged),
# and the first layer's feed-forward output MatMul kept fp32. Chosen by measurement on
# all-MiniLM-L6-v2 (min row cosine 0.995, about 2x fp32's speed); benchmark/RESULTS.md, "The int8
# recipe", has the figures and the recipes tried and rejected. That was on a CPU with VNNI; one
# without gets unsigned weights (int8_recipe).
INT8_RECIPE = {"weight_type": "QInt8", "per_channel": True, "reduce_range": False,
               "smooth": (r".*",), "smooth_alpha": 0.5, "smooth_floor": 0.5,
               "exclude": (r".*/layer\.0/output/dense/MatMul",)}


def int8_recipe(vnni=None):
    """INT8_RECIPE for this CPU (or for one with or without VNNI). Without VNNI, ONNX Runtime's
    uint8 x int8 kernel saturates its 16-bit sums: on all-MiniLM-L6-v2 with AVX2 only, signed
    weights gave a min row cosine against fp32 of 0.982 on mixed texts and fell below the start-up
    check's bar; unsigned weights run on the uint8 x uint8 kernel, which does not saturate: min
    0.994, mean 0.998, top-10 neighbour overlap 0.965, at 1.24x fp32's speed on one thread (signed
    ran at 1.45x). 7-bit signed weights (reduce_range) did not saturate either but were worse."""
    vnni = has_vnni() if vnni is None else vnni
    return INT8_RECIPE if vnni else {**INT8_RECIPE, "weight_type": "QUInt8"}


def quantize(source, target, spec, recipe=None):
    """Dynamic int8 weights on every MatMul with a weight, except the nodes the recipe excludes;
    the inputs of those the recipe's "smooth" patterns name are smoothed first, with activation
    maxima measured on SAMPLE through the tokenizer of `spec` (those the fp32 file was
    exported for)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .smoothing import activation_maxima, smooth, weight_matmuls

    recipe = recipe or int8_recipe()
    graph = onnx.load(str(source), load_external_data=False).graph
    exclude = matching_matmuls(graph, recipe["exclude"])
    inputs = weight_matmuls(graph)
    smoothed = [name for name in matching_matmuls(graph, recipe["smooth"]) if name in inputs and name not in exclude]
    model = onnx.load(str(source))
    if smoothed:
        maxima = activation_maxima(source, spec, {inputs[name] for name in smoothed})
        smooth(model.graph, maxima, smoothed, recipe["smooth_alpha"], recipe["smooth_floor"])
    quantize_dynamic(model, str(target), weight_type=QuantType[recipe["weight_type"]],
                     per_channel=recipe["per_channel"], reduce_range=recipe["reduce_range"],
                     op_types_to_quantize=["MatMul"], nodes_to_exclude=exclude,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    move_weights_out(target)


def matching_matmuls(graph, patterns):
    """The graph's MatMul nodes whose whole name matches one of the patterns (regular expressions;
    a plain node name matches itself)."""
    return [node.name for node in graph.node
            if node.op_type == "MatMul" and any(re.fullmatch(pattern, node.name) for pattern in patterns)]


def to_fp16(source, target):
    """Half precision for CUDA; inputs, outputs and the pooling tail stay float32."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True,
                                     op_block_list=["ReduceSum", "ReduceMax", "ReduceL2", "Div", "Clip", "Where"])
    onnx.save(model, str(target))
    move_weights_out(target)


def move_weights_out(path):
    """Rewrite `path` with its weights in `path`.data (see model_cache)."""
    import onnx

    model = onnx.load(str(path))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
