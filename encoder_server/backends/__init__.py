"""Model backends. Each one takes a padded Pass and returns pooled float32 embeddings:

    encoder.embed(pass_) -> np.ndarray   # [n, dim], or [n, seq, dim] for `none` pooling
"""


def load_encoder(settings):
    if settings.backend == "torch":
        from .torch_backend import TorchEncoder
        return TorchEncoder(settings)
    raise ValueError(f"unknown backend {settings.backend!r}")
