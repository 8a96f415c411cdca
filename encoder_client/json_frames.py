"""JSON in frames, on the paths every request takes: written and read by orjson where it is
installed (it is one of the server's dependencies; for a client it is optional), which takes a
tenth of json's time, and by json wherever orjson is missing or refuses what json takes: a lone
surrogate in a string, NaN, UTF-16 input, and in what is written integers past 64 bits. The
errors raised for what neither takes are json's.

Two values differ from json's, neither in any field of the protocol: orjson reads integers past
64 bits as floats, and writes NaN and infinities as null (json: NaN, Infinity), so these are for
values without floats."""
import json

try:
    import orjson
except ImportError:  # a client without it: json alone
    orjson = None


def to_json(value):
    """`value` (strings, ints, lists and dicts of them) as JSON bytes."""
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(value).encode()


def from_json(data):
    """The JSON value in `data` (bytes, or a buffer of them)."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(data) if isinstance(data, memoryview) else data)
