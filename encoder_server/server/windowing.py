"""The ventilator's windowing: requests whose long texts are embedded whole are tokenized and cut
into windows (model.tokenizer.Tokenizer.windows) on a thread of its own, so that the ventilator's
loop goes on meanwhile (a 50,000-token text takes about 0.2 s to tokenize; the tokenizer's batch
calls let other threads run, so this tokenizer leaves out word_pieces.py, whose Python holds the
GIL). A finished request wakes the loop through a socket pair that the loop polls. What waits here
is bounded in characters: past MAX_WAITING_CHARS a request is refused as busy, and a single
request above it as too large.
"""
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from encoder_client.protocol import TOO_LARGE, ProtocolError

MAX_WAITING_CHARS = 8_000_000  # about 2 million tokens, and 0.8 GB of the tokenizer's memory at the most


class Windowing:
    def __init__(self, models):
        self.models = models    # the served models' Settings
        self._tokenizers = {}   # model index -> its Tokenizer, made when a request first needs one
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="windowing")
        self._wake, self._waker = socket.socketpair()
        self._wake.setblocking(False)
        self._waiting = {}  # future -> (context, characters)
        self.chars = 0

    def fileno(self):
        """Readable when a request's windows are ready."""
        return self._wake.fileno()

    def surely_fit(self, model, texts, prompt):
        """Whether `texts`, after `prompt`, fit the model of index `model` without tokenizing them."""
        return self._tokenizer(model).surely_fit(texts, prompt)

    def submit(self, encode, model, choices, output):
        """Cut the texts of `encode` (an intake.EncodeRequest) for the model of index `model` into
        windows; `finished` gives them back with the request, its model, `choices`, `output` and when
        it arrived (the monotonic clock), from which its timeout counts.
        False when too many characters wait already; ProtocolError (too_large) for a request that
        alone holds too many."""
        chars = sum(len(text) for text in encode.texts)
        if chars > MAX_WAITING_CHARS:
            raise ProtocolError(f"the texts to chunk hold {chars} characters, above the server's limit of "
                                f"{MAX_WAITING_CHARS} per request; split the request", encode.identity,
                                encode.req_id, TOO_LARGE)
        if self.chars + chars > MAX_WAITING_CHARS:
            return False
        future = self._executor.submit(self._tokenizer(model).windows, encode.texts, choices["prompt"],
                                       self.models[model].chunk_overlap)
        self._waiting[future] = ((encode, model, choices, output, time.monotonic()), chars)
        self.chars += chars
        future.add_done_callback(lambda _: self._waker.send(b"."))
        return True

    def _tokenizer(self, model):
        if model not in self._tokenizers:
            # imported on first use: a server that is never asked to embed long texts whole keeps the
            # tokenizers library out of its ventilator (and of the supervisor, which imports this module)
            from ..model.tokenizer import Tokenizer
            # tokenizers, which lets the ventilator's loop run while it encodes; Python would hold the GIL
            self._tokenizers[model] = Tokenizer.for_spec(self.models[model], python_pieces=False)
        return self._tokenizers[model]

    def finished(self):
        """((request, model, choices, output, arrived), (Encoding, windows per text) or the exception
        raised) for each request done."""
        try:
            while self._wake.recv(4096):
                pass
        except BlockingIOError:
            pass
        for future in [future for future in self._waiting if future.done()]:
            context, chars = self._waiting.pop(future)
            self.chars -= chars
            try:
                yield context, future.result()
            except Exception as error:  # a text the tokenizer could not take: its request fails, not the loop
                yield context, error

    def __len__(self):
        return len(self._waiting)

    def close(self):
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._wake.close()
        self._waker.close()
