"""Logging for every process of the server: text lines, or one JSON object per line."""
import json
import logging
import os

LOG_FORMAT_VARIABLE = "ENCODER_SERVER_LOG_FORMAT"


def configure_logging(name, verbose):
    """Log to stderr as text, or as one JSON object per line when ENCODER_SERVER_LOG_FORMAT=json
    (`--log-format json`, which the supervisor passes on to its children this way)."""
    handler = logging.StreamHandler()
    json_lines = os.environ.get(LOG_FORMAT_VARIABLE) == "json"
    handler.setFormatter(JsonLines(name) if json_lines else
                         logging.Formatter(f"%(asctime)s {name:>10} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    return logging.getLogger(name)


class JsonLines(logging.Formatter):
    def __init__(self, process_name):
        super().__init__()
        self.process_name = process_name

    def format(self, record):
        entry = {"time": self.formatTime(record), "process": self.process_name, "pid": record.process,
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)
