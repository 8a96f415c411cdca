"""Lightweight client of encoder-server; needs only pyzmq and numpy."""
from .aio import AsyncEncoderClient
from .protocol import EncodeResult
from .sparse import SparseVectors
from .client import EncoderClient
from .concurrent import ConcurrentEncoderClient
from .errors import ConnectionLostError, IdentityRefusedError, RequestTooLargeError, ServerBusyError, ServerError
from .version import __version__

__all__ = ["EncoderClient", "AsyncEncoderClient", "EncodeResult", "SparseVectors", "ConcurrentEncoderClient",
           "ServerError",
           "ServerBusyError", "ConnectionLostError", "IdentityRefusedError", "RequestTooLargeError", "__version__"]
