"""The model, usable without the service: a model folder's choices resolved (spec), its engines
(backends), tokenizer, pooling and the Embedder that runs them, texts in, float32 rows out (a
SparseEmbedder for a SPLADE model: SparseVectors out).

    from encoder_server.model import load
    embedder = load()                  # the bundled all-MiniLM-L6-v2, onnx on cpu
    rows = embedder.embed_texts(["a text"])

Nothing here imports the service (encoder_server.server, the gateway, the settings) or opens a
socket. `load` and `Embedder` are imported on first use, so that reading the pooling table or the
spec does not load the model's libraries.
"""
__all__ = ["Embedder", "SparseEmbedder", "load"]


def __getattr__(name):
    if name == "Embedder":
        from .embedder import Embedder
        return Embedder
    if name == "SparseEmbedder":
        from .sparse_encoder import SparseEmbedder
        return SparseEmbedder
    if name == "load":
        from .prepare import load
        return load
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
