"""encoder-server: sentence embeddings from a BERT-family encoder, served over ZeroMQ."""
__version__ = "0.1.0"
