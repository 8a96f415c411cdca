"""The gateway's waits and connection limits: their names among the server's settings, and the
pause it asks clients to take before they retry."""
GATEWAY_TIMEOUT = 60.0  # seconds the HTTP gateway waits on the server for any one request (504 after)
# the settings (and `encoder-server http` options) that bound the gateway's connections
HTTP_LIMITS = ("http_keep_alive", "http_header_timeout", "http_body_timeout", "http_max_connections")
RETRY_LATER = {"Retry-After": "1"}  # the header of every 429 and 503: a server busy or not reachable yet
