"""Deterministic benchmark texts, made offline from the standard library's own documentation.

Three workloads, by length in the bundled model's tokens: short (~10-15), medium (~50-70) and
long (~200-256). Each text is a contiguous window of real English prose, so tokenization and
attention see natural text rather than random words.
"""
import importlib
import random
import re
import warnings

SOURCES = ("argparse", "asyncio", "collections", "csv", "email", "functools", "http.client", "json",
           "logging", "pathlib", "pickle", "random", "socket", "statistics", "subprocess", "threading",
           "typing", "unittest", "urllib.request", "zipfile")
WORDS = {"short": (6, 9), "medium": (32, 42), "long": (150, 180)}


def _prose():
    words = []
    for name in SOURCES:
        module = importlib.import_module(name)
        with warnings.catch_warnings():  # typing's deprecated `io` and `re` warn when looked at
            warnings.simplefilter("ignore", DeprecationWarning)
            docs = [module.__doc__] + [obj.__doc__ for obj in vars(module).values()
                                       if callable(obj) and getattr(obj, "__module__", None) == name]
        for doc in docs:
            if isinstance(doc, str):
                words += re.sub(r"[^\w.,;:'()-]+", " ", doc).split()
    return words


def texts(kind, count, seed=0):
    """`count` texts of the given kind, the same ones on every call."""
    low, high = WORDS[kind]
    words = _prose()
    rng = random.Random(f"{kind}-{seed}")
    out = []
    for _ in range(count):
        size = rng.randint(low, high)
        start = rng.randrange(len(words) - size)
        out.append(" ".join(words[start:start + size]))
    return out
