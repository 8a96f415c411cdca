class ServerError(RuntimeError):
    """The server refused a request and said why."""

    def __init__(self, message, req_id=None):
        super().__init__(message)
        self.req_id = req_id
