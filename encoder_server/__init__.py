"""encoder-server: sentence embeddings from a BERT-family encoder, served over ZeroMQ.

`from encoder_server import load_model` gives the model itself, in-process, without the service
(for Ray and other libraries): `load_model()` is encoder_server.model.load, and returns an
Embedder. Both are loaded on first use, so the server's light processes and the CLI never import
the model's libraries through this package.
"""
from encoder_client.version import __version__

__all__ = ["Embedder", "load_model", "__version__"]


def __getattr__(name):
    if name in ("Embedder", "load_model"):
        from . import model
        return model.Embedder if name == "Embedder" else model.load
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
