"""Model backends, and the Embedder built on them.

A backend runs one padded Pass (backends.passes) through the pooled encoder:

    backend.run(pass_) -> np.ndarray   # [n, dim], or [n, seq, dim] for token-level pooling

BACKENDS is the one table of them: the settings and the CLI take their names from it, and
load_backend builds from it.
"""
from dataclasses import dataclass, replace
from importlib import import_module


@dataclass(frozen=True)
class BackendKind:
    module: str        # the module under encoder_server.backends that holds it
    class_name: str
    default_on: tuple  # the devices it is the default on


BACKENDS = {"onnx": BackendKind("onnx_backend", "OnnxBackend", default_on=("cpu",)),
            "torch": BackendKind("torch_backend", "TorchBackend", default_on=("cuda",))}


def default_backend(device):
    return next(name for name, kind in BACKENDS.items() if device in kind.default_on)


def load_backend(settings, **options):
    kind = BACKENDS[settings.backend]
    return getattr(import_module(f".{kind.module}", __name__), kind.class_name)(settings, **options)


def prepare_model(settings):
    """Settings ready for workers: for onnx, the cached (built once) file to serve, int8 checked first."""
    if settings.backend != "onnx":
        return settings
    from .model_cache import onnx_files
    fp32_file, served_file = onnx_files(settings)
    if settings.quantize == "int8":
        from .quantization_check import check_int8
        check_int8(settings, fp32_file, served_file)
    return replace(settings, onnx_file=str(served_file))


def prepare_model_apart(settings, process_name="model"):
    """prepare_model in a child process, so that the caller (the supervisor, a remote worker's
    host) never holds what the export and the int8 check load: torch, transformers' model code and
    two ONNX sessions, about 400 MB that it would keep for its whole life."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from ..model_folder import ConfigError
    from ..runtime import configure_logging

    with ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), initializer=configure_logging,
                             initargs=(process_name, settings.verbose)) as child:
        try:
            return child.submit(prepare_model, settings).result()
        except BrokenProcessPool:
            raise ConfigError("the process preparing the model died (killed, or out of memory); "
                              "see the log above") from None
