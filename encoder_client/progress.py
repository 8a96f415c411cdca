"""Progress for long encodes: the list is cut into sub-requests and counted on a tqdm bar."""
PROGRESS_CHUNK = 1024  # texts per sub-request: enough to keep every worker busy, small enough to report often


def chunks(texts, size):
    return [texts[start:start + size] for start in range(0, len(texts), size)]


def progress_bar(total):
    """A tqdm bar counting texts; tqdm is optional for the client (pip install tqdm)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("show_progress=True needs tqdm: pip install tqdm") from None
    return tqdm(total=total, unit="text", desc="encoding", smoothing=0.1)
