"""The version of the encoder-server distribution, which ships the client and the server alike."""
__version__ = "0.1.0"
