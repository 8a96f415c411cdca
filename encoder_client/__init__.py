"""Lightweight client of encoder-server; needs only pyzmq and numpy."""
from .client import EncoderClient
from .concurrent import ConcurrentEncoderClient
from .errors import ServerError

__version__ = "0.1.0"
__all__ = ["EncoderClient", "ConcurrentEncoderClient", "ServerError", "__version__"]
