"""Smoothing before int8 (SmoothQuant-like): move the outlier channels of each MatMul's input into
its weight, so that per-tensor activation scales lose less, while the fp32 function stays the same.
`activation_maxima` calibrates on the built-in SAMPLE (model.sample); `smooth` rewrites the graph."""
import numpy as np

from .sample import SAMPLE


def weight_matmuls(graph):
    """{node name: its input tensor} for the MatMul nodes whose weight is an initializer, in graph order."""
    weights = {tensor.name for tensor in graph.initializer}
    return {node.name: node.input[0] for node in graph.node if node.op_type == "MatMul" and node.input[1] in weights}


def smooth(graph, maxima, nodes, alpha, floor):
    """Rewrite `graph` (weights loaded) in place so that the named MatMul nodes see flatter inputs
    and compute the same: for each input x with per-channel maxima m = maxima[x] (max |x| over
    tokens), channel j is divided by s_j = max(m_j / t, 1) ** alpha, t the `floor` quantile of m,
    by one Mul that the nodes reading x share, and row j of each node's weight is multiplied by
    s_j. A node whose weight is not an initializer of its own is left alone."""
    from onnx import helper, numpy_helper

    weights = {tensor.name: tensor for tensor in graph.initializer}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    chosen = [node for node in graph.node if node.name in nodes and node.op_type == "MatMul"
              and node.input[1] in weights and readers[node.input[1]] == 1]
    scaled = {}  # input -> (its smoothed name, s)
    for node in chosen:
        source = node.input[0]
        if source not in scaled:
            high = np.asarray(maxima[source], dtype=np.float64)
            scale = np.maximum(high / max(np.quantile(high, floor), 1e-12), 1.0) ** alpha
            scaled[source] = (f"{source}/smoothed", scale)
            divisor = numpy_helper.from_array((1 / scale).astype(np.float32), f"{source}/smooth_scale")
            graph.initializer.append(divisor)
            mul = helper.make_node("Mul", [source, divisor.name], [scaled[source][0]], name=f"{source}/smooth")
            graph.node.insert(list(graph.node).index(node), mul)  # before the first reader: still sorted
        name, scale = scaled[source]
        weight = weights[node.input[1]]
        array = numpy_helper.to_array(weight)
        weight.CopyFrom(numpy_helper.from_array((array * scale[:, None]).astype(np.float32), weight.name))
        node.input[0] = name
    return graph


def activation_maxima(path, spec, tensors, texts=None):
    """{tensor: per-channel max |x| over the real tokens of `texts` (default: the built-in
    SAMPLE)} for these float tensors of the ONNX file; texts run one at a time, so no padding."""
    import onnx
    import onnxruntime as ort

    from .passes import Pass
    from .tokenizer import Tokenizer

    model = onnx.load(str(path))
    tensors = sorted(tensors)
    model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in tensors)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.for_spec(spec)
    encoding = tokenizer.tokenize(SAMPLE if texts is None else texts)
    maxima = {}
    for index, ids in enumerate(encoding.ids):
        one = Pass.pad([ids], [encoding.pooled_row(index)], tokenizer.pad_id)
        feed = {item.name: getattr(one, item.name) for item in session.get_inputs()}
        for name, value in zip(tensors, session.run(tensors, feed)):
            high = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima.get(name, high), high)
    return maxima
