"""Lightweight client of encoder-server; needs only pyzmq and numpy."""
from .aio import AsyncEncoderClient, EncodeResult
from .client import EncoderClient
from .concurrent import ConcurrentEncoderClient
from .errors import ConnectionLostError, IdentityRefusedError, RequestTooLargeError, ServerBusyError, ServerError
from .version import __version__

__all__ = ["EncoderClient", "AsyncEncoderClient", "EncodeResult", "ConcurrentEncoderClient", "ServerError",
           "ServerBusyError", "ConnectionLostError", "IdentityRefusedError", "RequestTooLargeError", "__version__"]
