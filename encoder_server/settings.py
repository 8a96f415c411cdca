"""Turn command-line choices plus the model folder's own configs into the settings every process uses."""
import os
from dataclasses import asdict, dataclass

from .model_folder import UNSUPPORTED_POOLING, ConfigError, default_model_path, inspect_model_folder

STRATEGIES = ("mean", "max", "mean_max", "cls", "last", "none")
_MASKABLE = ("mean", "max", "mean_max", "none")
# chosen by measurement: benchmark/RESULTS.md
DEFAULT_BACKEND = {"cpu": "onnx", "cuda": "torch"}
DEFAULT_BATCH_TOKENS = {"cpu": 1024, "cuda": 16384}


@dataclass(frozen=True)
class PoolingSpec:
    strategy: str
    layers: tuple
    mask_cls_sep: bool = False
    normalize: bool = False

    def describe(self):
        layers = ", ".join(str(layer) for layer in self.layers)
        extras = [name for name in ("mask_cls_sep", "normalize") if getattr(self, name)]
        return f"{self.strategy} over layer(s) {layers}" + (f" + {' + '.join(extras)}" if extras else "")


@dataclass(frozen=True)
class Settings:
    model: str
    model_name: str           # the stable id clients see (HTTP's /v1/models)
    pooling: PoolingSpec
    pooling_source: str
    max_seq_len: int          # None: pad to the longest text of each batch
    truncate_at: int          # tokens kept per text
    num_layers: int
    host: str = "127.0.0.1"
    port: int = 5555
    port_out: int = 5556
    backend: str = "onnx"
    device: str = "cpu"
    fp16: bool = False
    quantize: str = None      # None or "int8"
    min_quant_cosine: float = 0.99
    onnx_file: str = None     # set by backends.prepare_model
    num_worker: int = 1
    threads_per_worker: int = 1
    priority_batch_size: int = 16
    max_batch_size: int = 64
    max_batch_tokens: int = 1024
    batch_wait_ms: float = 0.0
    prefetch_size: int = 2
    show_tokens_to_client: bool = False
    graceful_timeout: float = 30.0
    max_pending_texts: int = 100_000  # texts of admitted, unfinished requests; past it: "busy"
    max_request_mb: int = 128         # the largest message the request port accepts
    server_key: str = None            # the server's .key_secret file: CURVE on the public ports
    authorized_clients: str = None    # folder of client .key files allowed in; None admits any key
    worker_port: int = None           # jobs port for workers on other hosts; results on the next one
    http_port: int = None             # the built-in HTTP gateway's port; None: no gateway
    http_host: str = None             # where the gateway listens (default: host)
    api_key: str = None               # bearer key the HTTP embedding routes ask for
    verbose: bool = False

    def listening(self):
        """(host, port) of every port this server listens on."""
        ports = [(self.host, self.port), (self.host, self.port_out)]
        if self.worker_port:
            ports += [(self.host, self.worker_port), (self.host, self.worker_port + 1)]
        if self.http_port:
            ports.append((self.http_host or self.host, self.http_port))
        return ports

    def public_config(self):
        """What SHOW_CONFIG reveals: no file-system paths, no internal addresses."""
        config = asdict(self)
        config["model"] = os.path.basename(os.path.normpath(self.model))
        config["pooling_strategy"] = self.pooling.strategy
        config["pooling_layer"] = list(self.pooling.layers)
        config["mask_cls_sep"] = self.pooling.mask_cls_sep
        config["normalize"] = self.pooling.normalize
        config["curve"] = self.server_key is not None
        config["clients_authenticated"] = self.authorized_clients is not None
        for private in ("pooling", "host", "onnx_file", "server_key", "authorized_clients", "api_key", "http_host"):
            del config[private]
        return config


BUNDLED_MODEL_NAME = "all-MiniLM-L6-v2"


def resolve(model=None, model_name=None, pooling_strategy=None, pooling_layer=None, mask_cls_sep=False, normalize=None,
            max_seq_len="auto", num_worker=None, threads_per_worker=None, device="cpu", fp16=False,
            backend=None, quantize=None, max_batch_tokens=None, **rest):
    """Settings from user choices; every choice left as None takes the model folder's default."""
    info = inspect_model_folder(model or default_model_path())
    from_st = info.st_pooling is not None
    if pooling_strategy is None and info.st_pooling == UNSUPPORTED_POOLING:
        raise ConfigError(f"--model {info.path}: its sentence-transformers pooling has no equivalent "
                          "here; choose one with --pooling-strategy")
    pooling = PoolingSpec(
        strategy=pooling_strategy or (info.st_pooling if from_st else "mean"),
        layers=tuple(pooling_layer or ([-1] if from_st else [-2])),
        mask_cls_sep=mask_cls_sep,
        normalize=info.st_normalize if normalize is None else normalize)
    _check_pooling(pooling, info.num_layers)
    seq_len = _resolve_max_seq_len(max_seq_len, info, from_st)
    backend = backend or DEFAULT_BACKEND[device]
    _check_engine(device, fp16, backend, quantize)
    if num_worker is None:
        num_worker = _cpu_count() if device == "cpu" else 1
    if max_batch_tokens is None:
        max_batch_tokens = DEFAULT_BATCH_TOKENS[device]
    _check_sizes(num_worker=num_worker, threads_per_worker=threads_per_worker or 1,
                 max_batch_tokens=max_batch_tokens, **rest)
    _check_keys(rest.get("server_key"), rest.get("authorized_clients"))
    return Settings(
        model=str(info.path), pooling=pooling,
        model_name=model_name or (os.path.basename(info.path) if model else BUNDLED_MODEL_NAME),
        pooling_source="sentence-transformers config" if from_st else "bert-as-service defaults",
        max_seq_len=seq_len, truncate_at=seq_len or info.max_positions, num_layers=info.num_layers,
        device=device, fp16=fp16, backend=backend, quantize=quantize, num_worker=num_worker,
        max_batch_tokens=max_batch_tokens,
        threads_per_worker=threads_per_worker or _default_threads(num_worker, device), **rest)


def _check_pooling(pooling, num_layers):
    if pooling.strategy not in STRATEGIES:
        raise ConfigError(f"--pooling-strategy {pooling.strategy}: choose one of {', '.join(STRATEGIES)}")
    if pooling.mask_cls_sep and pooling.strategy not in _MASKABLE:
        raise ConfigError(f"--mask-cls-sep has no meaning with --pooling-strategy {pooling.strategy}")
    for layer in pooling.layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise ConfigError(f"--pooling-layer {layer}: the model has {num_layers} layers, so use "
                              f"{-(num_layers + 1)}..{num_layers} (0 is the embedding output)")


def _resolve_max_seq_len(value, info, from_st):
    if value == "auto":
        value = info.st_max_seq_len if from_st and info.st_max_seq_len else info.max_positions
    if value is None:
        return None
    if value < 3:
        raise ConfigError(f"--max-seq-len {value}: must be at least 3 ([CLS] + one token + [SEP])")
    if value > info.max_positions:
        raise ConfigError(f"--max-seq-len {value} is above the model's limit of {info.max_positions} tokens")
    return value


def _check_engine(device, fp16, backend, quantize):
    if fp16 and device != "cuda":
        raise ConfigError("--fp16 needs --device cuda")
    if quantize and (backend != "onnx" or device != "cpu"):
        raise ConfigError("--quantize int8 needs --backend onnx on --device cpu")
    if device == "cuda" and backend == "torch":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible to torch")
    if device == "cuda" and backend == "onnx":
        import onnxruntime
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise ConfigError("--device cuda --backend onnx needs the onnxruntime-gpu package")


def _check_sizes(**sizes):
    for name in ("num_worker", "threads_per_worker", "priority_batch_size", "max_batch_size",
                 "max_batch_tokens", "prefetch_size", "max_pending_texts", "max_request_mb"):
        if name in sizes and sizes[name] < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {sizes[name]}")
    for name in ("worker_port", "http_port"):
        if sizes.get(name) is not None and not 0 < sizes[name] < 65535:
            raise ConfigError(f"--{name.replace('_', '-')} {sizes[name]} is not a usable port")
    if sizes.get("priority_batch_size", 16) > sizes.get("max_batch_size", 64):
        raise ConfigError("--priority-batch-size must not exceed --max-batch-size")
    if not 0 < sizes.get("min_quant_cosine", 0.99) <= 1:
        raise ConfigError(f"--min-quant-cosine must be in (0, 1], got {sizes['min_quant_cosine']}")
    if sizes.get("batch_wait_ms", 0) < 0:
        raise ConfigError(f"--batch-wait-ms must not be negative, got {sizes['batch_wait_ms']}")


def _check_keys(server_key, authorized_clients):
    if authorized_clients and not server_key:
        raise ConfigError("--authorized-clients needs --server-key (make one with `encoder-server keygen`)")
    if authorized_clients and not os.path.isdir(authorized_clients):
        raise ConfigError(f"--authorized-clients {authorized_clients}: not a folder")
    if server_key:
        from .security import load_key_pair
        try:
            load_key_pair(server_key)
        except (OSError, ValueError) as error:
            raise ConfigError(f"--server-key {server_key}: {error}") from None


def _cpu_count():
    return len(os.sched_getaffinity(0))


def _default_threads(num_worker, device):
    if device == "cuda":
        return 1
    return max(1, _cpu_count() // num_worker)
