"""A deadline for the request head, which uvicorn lacks.

uvicorn closes a connection left idle after a response (`timeout_keep_alive`), but waits forever for
a request head: on a new connection that sends nothing, and on one that sends part of a head and
stalls (slowloris), each holding a socket. This is uvicorn's own HTTP protocol (httptools, else h11)
with one timer more: a connection that has not completed a request head `header_timeout` seconds
after it opened, or after the first byte of its next request, is closed. Both implementations make a
new `self.cycle` when a head is complete, which is what ends the wait. The body has its own deadline,
in body_limit.py."""
from uvicorn.protocols.http.auto import AutoHTTPProtocol


class HeaderTimeoutProtocol(AutoHTTPProtocol):
    header_timeout = 10.0
    _head_timer = None
    _head_after = None  # the request cycle that was current when the wait began

    def connection_made(self, transport):
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data):
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._await_head()  # the first bytes of a request after the previous one was answered
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._head_after:
            self._stop_waiting()  # its head is complete: the request runs, under the body's deadline

    def connection_lost(self, exc):
        self._stop_waiting()
        super().connection_lost(exc)

    def _await_head(self):
        self._head_after = self.cycle
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_waiting(self):
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self):
        self._head_timer = None
        if not self.transport.is_closing():
            self.logger.debug("%s:%d - no complete request head within %gs; closing", *(self.client or ("?", 0)),
                              self.header_timeout)
            self.transport.close()


def with_header_timeout(seconds):
    """The protocol class to give uvicorn.Config(http=...)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
