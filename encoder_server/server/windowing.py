"""The ventilator's windowing: requests whose long texts are embedded whole are tokenized and cut
into windows (model.tokenizer.Tokenizer.windows) on a thread of its own, so that the ventilator's
loop goes on meanwhile (a 50,000-token text takes about 0.2 s to tokenize; the tokenizer's batch
calls let other threads run). A finished request wakes the loop through a socket pair that the
loop polls. What waits here is bounded in characters: past MAX_WAITING_CHARS a request is refused
as busy, and a single request above it as too large.
"""
import socket
from concurrent.futures import ThreadPoolExecutor

MAX_WAITING_CHARS = 8_000_000  # about 2 million tokens, and 0.8 GB of the tokenizer's memory at the most


class Windowing:
    def __init__(self):
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="windowing")
        self._wake, self._waker = socket.socketpair()
        self._wake.setblocking(False)
        self._waiting = {}  # future -> (context, characters)
        self.chars = 0

    def fileno(self):
        """Readable when a request's windows are ready."""
        return self._wake.fileno()

    def submit(self, tokenizer, texts, prompt, overlap, context):
        """Cut `texts` into windows; `context` comes back with the result (see `finished`)."""
        chars = sum(len(text) for text in texts)
        future = self._executor.submit(tokenizer.windows, texts, prompt, overlap)
        self._waiting[future] = (context, chars)
        self.chars += chars
        future.add_done_callback(lambda _: self._waker.send(b"."))

    def finished(self):
        """(context, (Encoding, windows per text) or the exception raised) for each request done."""
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
