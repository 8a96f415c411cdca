"""Which models a server serves: one `--model`, `--model` given several times, or a models file.

A models file (`--models models.toml`, read with the standard library's tomllib) lists each
model as a `[[models]]` table: its `name` (or `names`, the first the one it is listed under), and
any of the model's own choices under their option names (model, revision, kind, pooling_strategy,
max_seq_len, backend, quantize, num_worker, threads_per_worker, ...), plus `prompts`, a table of
prompt names and texts added to the model folder's. A choice a table leaves out is the command
line's (or its environment variable's), else the model's default. The first model is the default
one: requests that name no model go to it. Pure: reads the file, starts nothing.
"""
import os

from .model.model_folder import ConfigError
from .model.spec import ModelSpec, choices_of, parse_max_seq_len

# what a [[models]] table may set, beside name, names and prompts: the model's choices and its workers
MODEL_KEYS = tuple(choice.name for choice in choices_of(ModelSpec)) + ("num_worker", "lanes", "tokenizer_threads",
                                                                      "model_name")
_TYPES = {choice.name: choice.type for choice in choices_of(ModelSpec)}
_TYPES.update(num_worker=int, lanes=int, tokenizer_threads=int, model_name=tuple, pooling_layer=tuple)


def model_entries(model=None, models_file=None):
    """Each served model's own choices, the default model first: a list of dicts (ModelSpec field ->
    value, `names` -> its names from a models file)."""
    if models_file is not None:
        if model:
            raise ConfigError("--model and --models together: list every model in the models file")
        return read_models_file(models_file)
    if isinstance(model, (list, tuple)):
        return [{"model": name} for name in model] or [{}]
    return [{"model": model}]


def read_models_file(path):
    import tomllib

    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"--models {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--models {path}: not valid TOML: {error}") from None
    tables = document.get("models")
    unknown = sorted(set(document) - {"models"})
    if unknown:
        raise ConfigError(f"--models {path}: unknown key {unknown[0]!r} at the top; list models as [[models]] tables")
    if not (isinstance(tables, list) and tables and all(isinstance(table, dict) for table in tables)):
        raise ConfigError(f"--models {path}: no [[models]] tables")
    return [_entry(table, f"--models {os.path.basename(path)}, model {index + 1}") for index, table in
            enumerate(tables)]


def _entry(table, where):
    entry = {}
    names = table.get("names", table.get("name"))
    if "name" in table and "names" in table:
        raise ConfigError(f"{where}: give name or names, not both")
    if names is not None:
        names = [names] if isinstance(names, str) else names
        if not (isinstance(names, list) and names and all(isinstance(n, str) and n.strip() for n in names)):
            raise ConfigError(f"{where}: name(s) must be non-empty strings")
        entry["names"] = [n.strip() for n in names]
    prompts = table.get("prompts")
    if prompts is not None:
        if not (isinstance(prompts, dict) and all(isinstance(text, str) for text in prompts.values())):
            raise ConfigError(f"{where}: prompts must be a table of prompt names and texts")
        entry["prompts"] = prompts
    for key, value in table.items():
        if key in ("name", "names", "prompts"):
            continue
        if key not in MODEL_KEYS:
            raise ConfigError(f"{where}: {key!r} is not a model's choice (those are: name, names, prompts, "
                              f"{', '.join(MODEL_KEYS)}); server options go on the command line")
        entry[key] = _typed(key, value, where)
    return entry


def _typed(key, value, where):
    expected = _TYPES[key]
    if key == "max_seq_len":
        return parse_max_seq_len(str(value))
    if expected is tuple:
        value = value if isinstance(value, list) else [value]
        return tuple(value)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: {key} must be a {expected.__name__}, got {value!r}")
    return value


def check_names(served):
    """ConfigError when two served models answer to one name."""
    owners = {}
    for settings in served:
        for name in settings.model_name:
            if name in owners and owners[name] is not settings:
                raise ConfigError(f"two models answer to the name {name!r} ({owners[name].model} and "
                                  f"{settings.model}): give each its own name")
            owners[name] = settings
