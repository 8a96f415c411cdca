"""A backend that runs no model: zero rows of the right shape, at once. It is for measuring what
the server itself costs per text and per request (benchmark/pipeline.py), so it exists only where
the environment says ENCODER_SERVER_ZERO_BACKEND=1 (see backends.BACKENDS); never serve with it."""
import numpy as np


class ZeroBackend:
    def __init__(self, spec, threads=None):
        self.width = spec.embedding_dim  # one score for a reranker, the vocabulary for a sparse model
        self.token_level = spec.pooling.token_level

    def run(self, inputs):
        rows, longest = inputs.input_ids.shape
        return np.zeros((rows, longest, self.width) if self.token_level else (rows, self.width), np.float32)
