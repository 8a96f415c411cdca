"""The reranking model, whole: a query and documents in, one float32 score per document out.

A Reranker tokenizes (query, document) pairs, cuts them into forward passes under the padded-token
budget, runs them on its backend (the cross-encoder's raw score, model.cross_encoder) and applies
the score activation the model folder declares, as sentence-transformers' CrossEncoder.predict
does. It has the Embedder's stages (`tokenize`, `run`, `finish`), so the worker runs either.
"""
import numpy as np

from .backends import load_backends
from .passes import passes_for
from .tokenizer import Tokenizer


def rerank_scores(raw, activation):
    """Raw scores through a CrossEncoder's activation (spec.SCORE_ACTIVATIONS), in float32."""
    raw = np.asarray(raw, dtype=np.float32)
    name = activation.rsplit(".", 1)[-1]
    if name == "Sigmoid":
        return (1 / (1 + np.exp(-raw))).astype(np.float32)
    if name == "Tanh":
        return np.tanh(raw)
    return raw


class Reranker:
    def __init__(self, spec, lone_threads=0, python_pieces=True):
        """From a resolved spec of kind rerank whose model files are ready (`lone_threads` and
        `python_pieces` as the Embedder takes them)."""
        self.spec = spec
        self.tokenizer = Tokenizer.for_spec(spec, python_pieces)
        self.backend, self.lone_backend = load_backends(spec, lone_threads)

    @property
    def dimension(self):
        return 1

    def tokenize(self, texts, is_tokenized=False, with_tokens=False, prompt="", query=None):
        """Documents, paired with `query`, as an Encoding (see Tokenizer.tokenize_pairs)."""
        if query is None or is_tokenized or with_tokens or prompt:
            raise ValueError("a reranker takes a query and texts, without word lists, tokens or prompts")
        return self.tokenizer.tokenize_pairs(query, texts)

    def run(self, inputs, alone=False):
        """One forward pass: raw scores, [rows, 1]."""
        return (self.lone_backend if alone and self.lone_backend else self.backend).run(inputs)

    def finish(self, rows, raw=False):
        """Scores as served: through the model's activation unless `raw`."""
        return np.asarray(rows, dtype=np.float32) if raw else rerank_scores(rows, self.spec.score_activation)

    def score(self, query, documents, raw=False):
        """One score per document, [len(documents)] float32, in input order."""
        return self.finish(self._raw_rows(self.tokenize(documents, query=query)), raw)[:, 0]

    def warm_up(self, texts):
        """Run each session once, so that no request pays for a first pass."""
        for alone in {False, self.lone_backend is not None}:
            self._raw_rows(self.tokenize(texts, query=texts[0]), alone)

    def _raw_rows(self, encoding, alone=False):
        """Raw scores [rows, 1] of tokenized pairs, in passes under the token budget, in input order."""
        rows = np.zeros((len(encoding), 1), dtype=np.float32)
        for group, inputs in passes_for(self.spec, encoding, self.tokenizer.pad_id):
            rows[group] = self.run(inputs, alone)
        return rows
