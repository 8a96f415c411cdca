"""The frames of the server's internal messages (messages.py): JSON (encoder_client.json_frames:
orjson, and json where orjson refuses), and each field checked against its declared type before a
message is made. Pure.

A field that fails its check raises MessageError, and a frame that is no JSON ValueError (which
messages.decode turns into a MessageError), so that a loop which catches it outlives anything a
peer on a worker port sends."""
import functools
import math
from dataclasses import MISSING, fields

from encoder_client.json_frames import from_json as _from_json
from encoder_client.json_frames import to_json  # noqa: F401 (messages.py writes its frames with it)


class MessageError(ValueError):
    """Frames that are no message of ours."""


def typed(message_type, values):
    """message_type(**values), once every field is present (or has a default) and has its type;
    numbers must be finite, and ints (ids, counts) not negative."""
    checks, required, defaults, factories = _fields_of(message_type)
    for name, value in values.items():
        check = checks.get(name)
        if check is None:
            raise MessageError(f"unknown field {name!r} in {message_type.__name__}")
        if not check(value):
            kind = next(f.type for f in fields(message_type) if f.name == name)
            raise MessageError(f"{message_type.__name__}.{name} is not a valid {getattr(kind, '__name__', kind)}")
    if not required <= values.keys():
        raise MessageError(f"{message_type.__name__} has no field {sorted(required - values.keys())[0]!r}")
    # the checked values go straight into the instance's fields, as its __init__ would put them
    # (the frozen dataclass's own __init__, setting one field at a time, takes twice as long)
    message = object.__new__(message_type)
    state = message.__dict__
    state.update(defaults)
    for name, factory in factories:
        state[name] = factory()
    state.update(values)
    return message


@functools.cache
def _fields_of(message_type):
    """({field name: what its values must pass}, the names of the fields without a default, {name:
    default}, [(name, default factory)]) of a message class, made once per class: messages are
    checked by the thousand each second."""
    checks = {f.name: _check_of(f.type, f.default is None) for f in fields(message_type)}
    required = {f.name for f in fields(message_type) if f.default is MISSING and f.default_factory is MISSING}
    defaults = {f.name: f.default for f in fields(message_type) if f.default is not MISSING}
    factories = [(f.name, f.default_factory) for f in fields(message_type) if f.default_factory is not MISSING]
    return checks, required, defaults, factories


def _check_of(kind, may_be_none):
    """What a field's values must pass; each check below refuses None by itself."""
    if kind is int:
        check = is_count
    elif kind is float:
        def check(value):  # JSON's numbers, finite; not bools (whose type is bool)
            return type(value) is int or type(value) is float and math.isfinite(value)
    elif kind is object:
        return lambda value: True
    else:
        def check(value):
            return isinstance(value, kind)
    if may_be_none:
        return lambda value: value is None or check(value)
    return check


def is_count(value):
    return type(value) is int and value >= 0  # (not a bool, whose type is bool)


def count(frame):
    value = int(frame)
    if value < 0:
        raise MessageError(f"expected a count, got {value}")
    return value


def from_json(frame):
    """The JSON value in `frame` (zmq.Frame or bytes)."""
    return _from_json(as_bytes(frame))


def objects(frame):
    """A non-empty JSON list of objects."""
    values = from_json(frame)
    if not (isinstance(values, list) and values and all(isinstance(value, dict) for value in values)):
        raise MessageError("expected a non-empty JSON list of objects")
    return values


def object_of(frame):
    """A JSON object."""
    value = from_json(frame)
    if not isinstance(value, dict):
        raise MessageError(f"expected a JSON object, got {type(value).__name__}")
    return value


def as_bytes(frame):
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)
