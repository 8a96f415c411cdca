"""The sparse model, whole: texts in, one SPLADE vector over the vocabulary per text out.

A SparseEmbedder has the Embedder's stages, so the worker runs either: `tokenize`, `run` (one pass:
dense float32 [rows, vocabulary] weights, from the SPLADE model that model.splade defines) and
`finish` (those rows as encoder_client.sparse.SparseVectors, zeros dropped, capped at top_k
entries as sentence-transformers' max_active_dims caps them). `embed_texts` does all three, in
passes under the padded-token budget, and `decode_tokens` names the vocabulary entries of a row.
"""
import numpy as np

from encoder_client.sparse import SparseVectors
from encoder_client.validation import check_texts

from .embedder import Embedder
from .passes import passes_for


class SparseEmbedder(Embedder):
    """An Embedder whose rows are sparse: it tokenizes and runs passes as the Embedder does (from a
    resolved spec of kind sparse; `dimension` is the vocabulary's size), and finishes them sparse."""

    def finish(self, rows, normalize=None, top_k=None):
        """Dense rows as served: SparseVectors of their non-zero entries, each row's `top_k` largest
        kept (None: the model's max_active_dims, if it has one), then scaled to unit length when
        `normalize` says so (None: as the model says, which is never for SPLADE)."""
        vectors = SparseVectors.from_dense(np.asarray(rows, dtype=np.float32))
        top_k = self.spec.max_active_dims if top_k is None else top_k
        if top_k is not None:
            vectors = vectors.top_k(top_k)
        return unit_rows(vectors) if (self.spec.normalize if normalize is None else normalize) else vectors

    def embed_texts(self, texts, prompt=None, top_k=None, normalize=None, long_texts=None):
        """SparseVectors of len(texts) rows in input order; TypeError or ValueError naming a bad text.
        `prompt` is prepended to each text (None: the model's default prompt, if any); `top_k` and
        `normalize` as `finish` takes them; `long_texts` truncate or error (chunk is for dense models)."""
        check_texts(texts)
        long_texts = long_texts or self.spec.long_texts
        if long_texts == "chunk":
            raise ValueError("long_texts=chunk embeds long texts whole with dense models only: use truncate or error")
        prompt = self.spec.prompts.get(self.spec.default_prompt_name, "") if prompt is None else prompt
        return self.embed_encoding(self.tokenize_whole(texts, prompt, long_texts == "error"), normalize, top_k=top_k)

    def embed_tokens(self, words, top_k=None, normalize=None):
        """The same for texts already split into words (bert-as-service's is_tokenized)."""
        check_texts(words, is_tokenized=True)
        return self.embed_encoding(self.tokenize(words, is_tokenized=True), normalize, top_k=top_k)

    def embed_encoding(self, encoding, normalize=None, alone=False, top_k=None):
        """Tokenized texts, in passes of similar length under the token budget, each pass made sparse
        as it comes (a dense [rows, vocabulary] array of a whole request would be large)."""
        parts, order = [], []
        for group, inputs in passes_for(self.spec, encoding, self.tokenizer.pad_id):
            parts.append(self.finish(self.run(inputs, alone), normalize, top_k))
            order.extend(group)
        return SparseVectors.concat(parts).take(np.argsort(order))

    def decode_tokens(self, indices):
        """The vocabulary's token strings at `indices` (a row's, say), in that order."""
        vocabulary = self.tokenizer._tokenizer  # tokenizers.Tokenizer: the model folder's own
        return [vocabulary.id_to_token(int(index)) for index in indices]


def unit_rows(vectors):
    """`vectors` with each row scaled to unit L2 length (empty rows stay empty)."""
    rows = np.repeat(np.arange(len(vectors)), np.diff(vectors.offsets))
    norms = np.sqrt(np.bincount(rows, weights=np.square(vectors.values, dtype=np.float64), minlength=len(vectors)))
    values = vectors.values / np.maximum(norms, 1e-12)[rows]
    return SparseVectors(vectors.indices, values, vectors.offsets, vectors.dim)
