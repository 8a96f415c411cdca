"""Model backends: the engines that run the pooled encoder.

A backend runs one padded Pass (model.passes) through the pooled encoder:

    backend.run(pass_) -> np.ndarray   # [n, dim], or [n, seq, dim] for token-level pooling

BACKENDS is the one table of them: the spec and the CLI take their names from it, and
load_backend builds from it. It holds `zero` (zero rows without a model, to measure the server's
own overhead) only where the environment sets ZERO_BACKEND_VARIABLE to 1, so that no production
server can be started on it by mistake.
"""
import os
from dataclasses import dataclass
from importlib import import_module


@dataclass(frozen=True)
class BackendKind:
    module: str        # the module under encoder_server.model that holds it
    class_name: str
    default_on: tuple  # the devices it is the default on


BACKENDS = {"onnx": BackendKind("onnx_backend", "OnnxBackend", default_on=("cpu",)),
            "torch": BackendKind("torch_backend", "TorchBackend", default_on=("cuda",))}
ZERO_BACKEND_VARIABLE = "ENCODER_SERVER_ZERO_BACKEND"
if os.environ.get(ZERO_BACKEND_VARIABLE) == "1":
    BACKENDS["zero"] = BackendKind("zero_backend", "ZeroBackend", default_on=())


def default_backend(device):
    return next(name for name, kind in BACKENDS.items() if device in kind.default_on)


def load_backend(spec, **options):
    kind = BACKENDS[spec.backend]
    return getattr(import_module(f".{kind.module}", __package__), kind.class_name)(spec, **options)


def load_backends(spec, lone_threads=0):
    """(backend, lone backend or None): a spec's backend, and with `lone_threads` above its threads per
    worker, for the onnx backend on cpu, a second session with that many threads for passes alone on
    the host (it costs the packed weights once more)."""
    lone = None
    if lone_threads > spec.threads_per_worker and spec.backend == "onnx" and spec.device == "cpu":
        lone = load_backend(spec, threads=lone_threads)
    return load_backend(spec), lone
