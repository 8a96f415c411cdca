"""encoder-server: sentence embeddings from a BERT-family encoder, served over ZeroMQ.

`from encoder_server import Embedder` gives the model itself, in-process, without the service
(for Ray and other libraries); it is loaded on first use, so the server's light processes and
the CLI never import the model's libraries through this package.
"""
__version__ = "0.1.0"
__all__ = ["Embedder", "__version__"]


def __getattr__(name):
    if name == "Embedder":
        from .backends.embedder import Embedder
        return Embedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
