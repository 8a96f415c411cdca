"""Reranking on the client side: checking a rerank call's arguments and ordering the scores the
server returns. Pure: no sockets. The server scores each (query, document) pair with a
cross-encoder; a rerank request is an encode request of the documents with the query among its
options, to a model of kind rerank, and its result is one score per document ([n, 1] float32)."""


def check_rerank(query, documents, top_n=None):
    """TypeError or ValueError naming what is wrong with a rerank call's arguments."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, got {type(query).__name__}")
    if not isinstance(documents, list):
        raise TypeError(f"documents must be a list of strings, got {type(documents).__name__}")
    if not documents:
        raise ValueError("documents must not be empty")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ValueError(f"top_n must be a positive integer, got {top_n!r}")


def ranked(scores, top_n=None, documents=None):
    """(index, score) pairs, best first (ties in input order), the first `top_n` of them; with
    `documents`, (index, score, document) triples."""
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))[:top_n]
    if documents is None:
        return [(index, float(scores[index])) for index in order]
    return [(index, float(scores[index]), documents[index]) for index in order]
