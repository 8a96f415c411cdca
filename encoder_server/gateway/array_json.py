"""A JSON response that may hold numpy arrays. orjson writes float32 rows as they are, each value in
the shortest form that reads back to the same float32: about 30 times faster than the standard
json module on lists of Python floats, and half the bytes."""
import json

import orjson
from starlette.responses import Response


class ArrayJSONResponse(Response):
    media_type = "application/json"

    def render(self, content):
        try:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError:
            # what orjson cannot write (an id beyond 64 bits, a lone surrogate that a request's JSON
            # held as an escape): the slow way, which escapes every character outside ASCII
            return json.dumps(content, default=lambda array: array.tolist()).encode()
