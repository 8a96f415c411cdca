"""Build the ONNX files the onnx backend runs: export the pooled encoder, then optionally
optimize it with ONNX Runtime's transformer fusions and quantize it to int8."""
import logging
import warnings

log = logging.getLogger(__name__)
OPSET = 17
OUTPUT_NAME = "embeddings"


def export(settings, path):
    """The pooled encoder as fp32 ONNX with dynamic batch and sequence axes."""
    import torch

    from .pooled_model import INPUT_NAMES, load_pooled_encoder

    encoder = load_pooled_encoder(settings, attention="eager")
    ids = torch.tensor([[2, 5, 6, 3], [2, 5, 3, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)  # padding in the sample, so the traced graph keeps the mask
    special = torch.tensor([[1, 0, 0, 1], [1, 0, 1, 0]], dtype=torch.int64)
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    axes[OUTPUT_NAME] = {0: "batch", 1: "sequence"} if settings.pooling.strategy == "none" else {0: "batch"}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes about branches that are constant for encoders
        # the TorchScript exporter: its graph gets ORT's attention and layer-norm fusions
        torch.onnx.export(encoder, (ids, mask, special), str(path), input_names=list(INPUT_NAMES),
                          output_names=[OUTPUT_NAME], dynamic_axes=axes, opset_version=OPSET, dynamo=False)


def optimize(source, target, num_heads, hidden_size):
    """ONNX Runtime's BERT fusions (attention, layer norm, GELU), applied offline."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimize_model(str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                   opt_level=0).save_model_to_file(str(target))


def quantize(source, target):
    """Dynamic int8: unsigned weights, one scale per output channel (the most accurate setting measured)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def to_fp16(source, target):
    """Half precision for CUDA; inputs, outputs and the pooling tail stay float32."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True,
                                     op_block_list=["ReduceSum", "ReduceMax", "ReduceL2", "Div", "Clip", "Where"])
    onnx.save(model, str(target))
