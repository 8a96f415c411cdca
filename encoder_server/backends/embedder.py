"""The model, whole: texts in, one float32 embedding per text out.

An Embedder tokenizes, cuts the rows into forward passes under a padded-token budget, runs them
on its backend (pooling and normalization are part of the model the backend runs) and returns the
rows in input order. The worker uses its two stages apart, `tokenize` on its prefetch thread and
`run` on its lanes, so they overlap; everything else (the worker's warm-up, the int8 check, the
benchmark's in-process engine, Ray and other in-process users) calls `embed_texts` or
`embed_tokens`.
"""
from encoder_client.validation import check_texts

from ..arrays import stack_rows
from . import load_backend, prepare_model
from .passes import plan_passes
from .tokenizer import Tokenizer


class Embedder:
    def __init__(self, settings):
        """From resolved settings whose model files are ready; `Embedder.load` does both."""
        self.settings = settings
        self.tokenizer = Tokenizer(settings.model, settings.truncate_at)
        self.backend = load_backend(settings)

    @classmethod
    def load(cls, model=None, **choices):
        """An Embedder for a model folder (default: the bundled all-MiniLM-L6-v2), taking the
        choices `encoder-server start` takes, as keywords (pooling_strategy="cls", quantize="int8").
        In one process its passes use every core unless threads_per_worker says otherwise."""
        from ..settings import resolve
        choices.setdefault("num_worker", 1)
        return cls(prepare_model(resolve(model=model, **choices)))

    @property
    def dimension(self):
        """Floats per embedding (per token with token-level pooling)."""
        return self.settings.embedding_dim

    def tokenize(self, texts, is_tokenized=False, with_tokens=False):
        return self.tokenizer.tokenize(texts, is_tokenized, with_tokens)

    def run(self, inputs):
        """One forward pass: pooled (and normalized, when the model says so) float32 rows."""
        return self.backend.run(inputs)

    def embed_texts(self, texts):
        """A [len(texts), dimension] float32 array; TypeError or ValueError naming a bad text."""
        check_texts(texts)
        return self.embed_encoding(self.tokenize(texts))

    def embed_tokens(self, words):
        """The same for texts already split into words (bert-as-service's is_tokenized)."""
        check_texts(words, is_tokenized=True)
        return self.embed_encoding(self.tokenize(words, is_tokenized=True))

    def embed_encoding(self, encoding):
        """Tokenized texts, embedded in passes of similar length under the token budget."""
        rows = [None] * len(encoding)
        for group, inputs in plan_passes(encoding, self.settings.max_batch_tokens, self.settings.max_batch_size,
                                         self.tokenizer.pad_id):
            for index, output in zip(group, self.run(inputs)):
                rows[index] = output
        return stack_rows(rows)
