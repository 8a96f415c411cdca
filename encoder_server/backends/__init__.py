"""Model backends. Each one takes a padded Pass and returns pooled float32 embeddings:

    encoder.embed(pass_) -> np.ndarray   # [n, dim], or [n, seq, dim] for `none` pooling
"""


def load_encoder(settings):
    if settings.backend == "torch":
        from .torch_backend import TorchEncoder
        return TorchEncoder(settings)
    if settings.backend == "onnx":
        from .onnx_backend import OnnxEncoder
        return OnnxEncoder(settings)
    raise ValueError(f"unknown backend {settings.backend!r}")


def prepare_model(settings):
    """Settings ready for workers: for onnx, the cached (built once) file to serve, int8 checked first."""
    if settings.backend != "onnx":
        return settings
    from dataclasses import replace

    from .model_cache import onnx_files
    fp32_file, served_file = onnx_files(settings)
    if settings.quantize == "int8":
        from .quantization_check import check_int8
        check_int8(settings, fp32_file, served_file)
    return replace(settings, onnx_file=str(served_file))
