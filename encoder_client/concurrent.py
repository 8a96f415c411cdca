"""A thread-safe pool of EncoderClients: each call borrows one client for its duration."""
import queue
from contextlib import contextmanager

from .client import EncoderClient


class ConcurrentEncoderClient:
    """Share one object between threads; up to `max_concurrency` requests run at once."""

    def __init__(self, max_concurrency=10, **client_kwargs):
        self._idle = queue.Queue()
        self._clients = []
        try:
            for _ in range(max_concurrency):
                client = EncoderClient(**client_kwargs)
                self._clients.append(client)
                self._idle.put(client)
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _borrow(self):
        client = self._idle.get()
        try:
            yield client
        finally:
            self._idle.put(client)

    def encode(self, texts, **kwargs):
        if kwargs.get("blocking") is False:
            raise ValueError("ConcurrentEncoderClient.encode is always blocking")
        with self._borrow() as client:
            return client.encode(texts, **kwargs)

    def encode_result(self, texts, **kwargs):
        """As EncoderClient.encode_result, on a borrowed client."""
        with self._borrow() as client:
            return client.encode_result(texts, **kwargs)

    def rerank(self, query, documents, **kwargs):
        """As EncoderClient.rerank, on a borrowed client."""
        with self._borrow() as client:
            return client.rerank(query, documents, **kwargs)

    @property
    def server_config(self):
        with self._borrow() as client:
            return client.server_config

    @property
    def server_status(self):
        with self._borrow() as client:
            return client.server_status

    def close(self):
        for client in self._clients:
            client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
