"""The model, whole: texts in, one float32 embedding per text out.

An Embedder tokenizes, cuts the rows into forward passes under a padded-token budget, runs them
on its backend (pooling and normalization are part of the model the backend runs) and returns the
rows in input order. The worker uses its two stages apart, `tokenize` on its prefetch thread and
`run` on its lanes, so they overlap; everything else (the worker's warm-up, the int8 check, the
benchmark's in-process engine, Ray and other in-process users) calls `embed_texts` or
`embed_tokens`.
"""
from encoder_client.validation import check_texts

from .arrays import normalize_rows, pad_token_axis, stack_rows
from .backends import load_backends
from .outputs import Output, calibration_ranges, finish
from .passes import passes_for
from .tokenizer import Tokenizer


class Embedder:
    def __init__(self, spec, lone_threads=0, python_pieces=True):
        """From a resolved spec (model.spec) whose model files are ready; model.load does both.
        `lone_threads` above the spec's threads per worker gives the onnx backend on cpu a
        second session with that many threads, for passes that `run` is told are alone on the
        host: a lone request then has every core (it costs the packed weights once more).
        `python_pieces`: the tokenizer's (see tokenizer.Tokenizer)."""
        self.spec = spec
        self.tokenizer = Tokenizer.for_spec(spec, python_pieces)
        self.backend, self.lone_backend = load_backends(spec, lone_threads)

    @property
    def dimension(self):
        """Floats per embedding (per token with token-level pooling)."""
        return self.spec.embedding_dim

    def tokenize(self, texts, is_tokenized=False, with_tokens=False, prompt="", query=None):
        if query is not None:
            raise ValueError("an embedding model takes no query; a reranker does")
        return self.tokenizer.tokenize(texts, is_tokenized, with_tokens, prompt)

    def run(self, inputs, alone=False):
        """One forward pass: pooled float32 rows, through the model's head, not normalized.
        `alone`: nothing else runs on the host, so the pass may take every core."""
        rows = (self.lone_backend if alone and self.lone_backend else self.backend).run(inputs)
        if self.spec.pooling.token_level and self.spec.max_seq_len:
            # token-level rows all come max_seq_len long, so that one request's passes stack
            return pad_token_axis(rows, self.spec.max_seq_len, axis=1)
        return rows

    def finish(self, rows, normalize=None):
        """Rows as served: L2-normalized when `normalize` says so (None: as the model says). (A
        Reranker's `finish` takes `raw` instead.)"""
        return normalize_rows(rows) if (self.spec.normalize if normalize is None else normalize) else rows

    def embed_texts(self, texts, prompt=None, normalize=None, long_texts=None):
        """A [len(texts), dimension] float32 array; TypeError or ValueError naming a bad text.
        `prompt` is prepended to each text (None: the server's default prompt, if any).
        `long_texts` says what a text longer than max_seq_len becomes (None: the spec's choice):
        truncate, error (ValueError) or chunk (the token-weighted mean of its windows)."""
        check_texts(texts)
        prompt = self.spec.prompts.get(self.spec.default_prompt_name, "") if prompt is None else prompt
        long_texts = long_texts or self.spec.long_texts
        if long_texts == "chunk":
            encoding, windows = self.tokenizer.windows(texts, prompt, self.spec.chunk_overlap)
            rows = self.embed_encoding(encoding, normalize=False)
            normalize = self.spec.normalize if normalize is None else normalize
            return finish(rows, Output(windows, [len(ids) for ids in encoding.ids], normalize=normalize))
        return self.embed_encoding(self.tokenize_whole(texts, prompt, long_texts == "error"), normalize)

    def tokenize_whole(self, texts, prompt, refuse_truncation):
        """`tokenize`, or with `refuse_truncation` a ValueError naming the first text too long."""
        encoding = self.tokenize(texts, prompt=prompt)
        if refuse_truncation and encoding.truncated:
            index = min(encoding.truncated)
            raise ValueError(f"texts[{index}] has {encoding.truncated[index]} tokens, more than max_seq_len "
                             f"({self.tokenizer.truncate_at})")
        return encoding

    def embed_tokens(self, words, normalize=None):
        """The same for texts already split into words (bert-as-service's is_tokenized)."""
        check_texts(words, is_tokenized=True)
        return self.embed_encoding(self.tokenize(words, is_tokenized=True), normalize)

    def embed_encoding(self, encoding, normalize=None, alone=False):
        """Tokenized texts, embedded in passes of similar length under the token budget."""
        rows = [None] * len(encoding)
        for group, inputs in passes_for(self.spec, encoding, self.tokenizer.pad_id):
            for index, output in zip(group, self.run(inputs, alone)):
                rows[index] = output
        return self.finish(stack_rows(rows), normalize)

    def calibration(self, texts):
        """The int8 and uint8 ranges (outputs.calibration_ranges) of `texts`' rows, as lists:
        {"raw": [starts, steps], "normalized": [starts, steps]}."""
        rows = self.embed_texts(texts, normalize=False, long_texts="truncate")
        return {name: [values.tolist() for values in calibration_ranges(sample)]
                for name, sample in (("raw", rows), ("normalized", normalize_rows(rows)))}

    def warm_up(self, texts):
        """Run each session once, so that no request pays for a first pass."""
        for alone in {False, self.lone_backend is not None}:
            self.embed_encoding(self.tokenize(texts), alone=alone)
