from .protocol import BUSY, RESTARTED, UNREADABLE


class ServerError(RuntimeError):
    """The server refused a request and said why; `code` is the kind of refusal (protocol.ERROR_CODES,
    or None)."""

    def __init__(self, message, req_id=None, code=None):
        super().__init__(message)
        self.req_id = req_id
        self.code = code


class ServerBusyError(ServerError):
    """The server is full and refused the request without queuing it; retry later."""


class ConnectionLostError(ConnectionError):
    """The connection to the server broke while a request was in flight, so its reply may never
    come (the server restarted, or the network failed); sending it again is safe."""


class IdentityRefusedError(PermissionError):
    """The server refused this client's subscription to its identity (under CURVE, another client
    key already uses it); no reply would ever reach the client."""


class RequestTooLargeError(ValueError):
    """The request is larger than the server accepts (--max-request-mb); it was not sent. Split it."""


def identity_refused(address, reply):
    """The exception for the server's word (a Reply) that it refused this client's subscription."""
    return IdentityRefusedError(f"the encoder-server at {address} refused this client's identity: {reply.error}")


def reply_error(reply):
    """The exception for an error reply (busy, refused, or lost to a restart inside the server)."""
    if reply.code == RESTARTED:
        return ConnectionLostError(reply.error)
    return (ServerBusyError if reply.code == BUSY else ServerError)(reply.error, reply.req_id, reply.code)


def with_array(reply):
    """`reply`, a reply to an encode request, once it is seen to hold an array: ServerError for one
    that holds none (a command's reply, which no encoder-server sends for one)."""
    if reply.array is None:
        raise ServerError(f"{UNREADABLE}: it answers an encode request with no array", reply.req_id)
    return reply
