"""Lightweight client of encoder-server; needs only pyzmq and numpy."""
from .protocol import EncodeResult
from .sparse import SparseVectors
from .client import EncoderClient
from .concurrent import ConcurrentEncoderClient
from .errors import ConnectionLostError, IdentityRefusedError, RequestTooLargeError, ServerBusyError, ServerError
from .version import __version__

__all__ = ["EncoderClient", "AsyncEncoderClient", "EncodeResult", "SparseVectors", "ConcurrentEncoderClient",
           "ServerError",
           "ServerBusyError", "ConnectionLostError", "IdentityRefusedError", "RequestTooLargeError", "__version__"]


def __getattr__(name):
    """AsyncEncoderClient is imported on first use: asyncio costs every process that imports this
    package (each of the server's, through the version) about 0.2 CPU seconds."""
    if name == "AsyncEncoderClient":
        from .aio import AsyncEncoderClient
        return AsyncEncoderClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
