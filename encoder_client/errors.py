from .protocol import BUSY


class ServerError(RuntimeError):
    """The server refused a request and said why."""

    def __init__(self, message, req_id=None):
        super().__init__(message)
        self.req_id = req_id


class ServerBusyError(ServerError):
    """The server is full and refused the request without queuing it; retry later."""


class ConnectionLostError(ConnectionError):
    """The connection to the server broke while a request was in flight, so its reply may never
    come (the server restarted, or the network failed); sending it again is safe."""


def reply_error(reply):
    """The exception for an error reply (busy or refused)."""
    return (ServerBusyError if reply.code == BUSY else ServerError)(reply.error, reply.req_id)
