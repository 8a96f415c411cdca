"""What SHOW_STATUS answers (`client.server_status`): the one written definition of it.

The server builds its status as a ServerStatus; every reader (the CLI, the HTTP gateway's
/ready, /metrics and status page) passes what it received through `check_status`, which names
the first field that is missing or of the wrong kind, so a renamed field fails loudly instead of
reading as 0.
"""
from typing import Dict, TypedDict, get_type_hints


class Histogram(TypedDict):
    buckets: list   # ascending upper bounds
    counts: list    # not cumulative; one more than `buckets`: the last counts values above them all
    sum: float
    count: int


class Histograms(TypedDict):
    queue_seconds: Histogram        # per job: admitted by the ventilator -> its first pass starts
    inference_seconds: Histogram    # per forward pass
    request_seconds: Histogram      # per request: admitted -> its last part reaches the sink
    batch_rows: Histogram
    batch_padded_tokens: Histogram


class Tokens(TypedDict):
    real: int
    padded: int


class Metrics(TypedDict):
    histograms: Histograms
    tokens: Tokens       # computed so far, without and with padding
    passes: int
    truncated: int       # texts cut at max_seq_len


class QueueDepth(TypedDict):
    priority: int        # jobs
    bulk: int            # jobs
    bulk_clients: int
    pending_texts: int   # texts of the requests in flight
    max_pending_texts: int


class Requests(TypedDict):
    served: int
    busy: int
    expired: int
    abandoned: int
    failed: int
    refused: int     # a worker found a text against the request's rules (too long with truncate=False)


class Texts(TypedDict):
    encoded: int
    expired: int
    abandoned: int
    failed: int
    refused: int


class ModelStatus(TypedDict):
    kind: str                # embed or rerank
    embedding_dim: int       # floats per row (1: a reranker's score)
    ready: bool              # its workers are all up
    workers_alive: int
    workers_expected: int
    queue_depth: Dict[str, int]   # its queued jobs: priority, bulk
    texts_encoded: int


class ServerStatus(TypedDict):
    ready: bool                       # every local worker warmed up and heartbeating, and not draining
    workers_alive: int
    workers_expected: int
    workers_remote: int
    workers_busy: int
    worker_busy_texts: Dict[str, int]       # worker name -> texts it holds
    worker_texts_encoded: Dict[str, int]    # worker name -> texts it has finished
    worker_restarts: int
    jobs_redispatched: int
    queue_depth: QueueDepth
    in_flight_requests: int
    requests_served: int
    requests: Requests
    texts: Texts
    replies_dropped: int  # by the sink, for clients that left more than --max-unread-mb unread
    draining: bool
    uptime_s: float
    server_version: str
    metrics: Metrics
    models: Dict[str, ModelStatus]    # each served model by name, the default first


class StatusError(ValueError):
    """A status that does not follow ServerStatus (a server of another version, or a bug)."""


def check_status(status):
    """`status` itself, once it has every field of ServerStatus, each of its kind; else StatusError."""
    _check(status, ServerStatus, "status")
    return status


def check_metrics(metrics):
    """`metrics` itself, once it has every field of Metrics (a worker's heartbeat carries one)."""
    _check(metrics, Metrics, "metrics")
    return metrics


def _check(value, schema, where):
    if not isinstance(value, dict):
        raise StatusError(f"{where} is not an object")
    for name, kind in get_type_hints(schema).items():
        if name not in value:
            raise StatusError(f"{where} has no field {name!r}")
        _check_value(value[name], kind, f"{where}.{name}")


def _check_value(value, kind, where):
    if isinstance(kind, type) and issubclass(kind, dict) and hasattr(kind, "__required_keys__"):
        _check(value, kind, where)
    elif getattr(kind, "__origin__", None) is dict:
        if not isinstance(value, dict):
            raise StatusError(f"{where} is not an object")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise StatusError(f"{where} is not a number")
    elif kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise StatusError(f"{where} is not an integer")
    elif kind in (bool, str, list) and not isinstance(value, kind):
        raise StatusError(f"{where} is not a {kind.__name__}")
