"""Frames exchanged between the server's own processes (never seen by clients).

    worker     -> ventilator  [READY, json]  |  [HEARTBEAT, json metrics since the last one]
                              |  [DROPPED, job_id] (deadline passed)
    ventilator -> worker      [JOB, json]  |  [HEARTBEAT]
    ventilator -> sink        [REGISTER, identity, json]  |  [PUBLISH, *public frames]
                              |  [FORGET, seq, error message or b""] (request cancelled)
    worker     -> sink        [PART, json, raw array bytes]
    sink       -> ventilator  [DONE, job_id]  |  [GONE, seq] (nobody listens for the request any more)
"""
import json
from dataclasses import fields

import numpy as np

from .assembly import Registration
from .scheduling import Job

_JOB_FIELDS = [field.name for field in fields(Job) if field.name not in ("client", "attempts")]

READY, HEARTBEAT, DROPPED, JOB = b"READY", b"HEARTBEAT", b"DROPPED", b"JOB"
REGISTER, PUBLISH, FORGET, PART, DONE, GONE = b"REGISTER", b"PUBLISH", b"FORGET", b"PART", b"DONE", b"GONE"


def job_frames(job):
    return [JOB, json.dumps({name: getattr(job, name) for name in _JOB_FIELDS}).encode()]


def decode_job(frames):
    return Job(**json.loads(frames[1]))


def register_frames(seq, registration):
    header = {"seq": seq, "req_id": registration.req_id, "rows": registration.rows,
              "with_tokens": registration.with_tokens}
    return [REGISTER, registration.identity, json.dumps(header).encode()]


def decode_register(frames):
    header = json.loads(frames[2])
    seq = header.pop("seq")
    return seq, Registration(identity=frames[1], **header)


def part_frames(seq, job_id, offset, array, tokens=None, num_tokens=0):
    header = {"seq": seq, "job_id": job_id, "offset": offset, "dtype": str(array.dtype),
              "shape": list(array.shape), "tokens": tokens, "num_tokens": num_tokens}
    return [PART, json.dumps(header).encode(), memoryview(np.ascontiguousarray(array)).cast("B")]


def decode_part(header_frame, body_frame):
    header = json.loads(header_frame)
    array = np.frombuffer(body_frame, dtype=header["dtype"]).reshape(header["shape"])
    return header, array


def ready_frames(pid, host, remote=False):
    return [READY, json.dumps({"pid": pid, "host": host, "remote": remote}).encode()]


def heartbeat_frames(metrics):
    return [HEARTBEAT, json.dumps(metrics).encode()]


def decode_heartbeat(frames):
    return json.loads(frames[1]) if len(frames) > 1 else {}


def decode_ready(frames):
    return json.loads(frames[1]) if len(frames) > 1 else {}


def number_frames(kind, number):
    """[kind, number]: DONE and DROPPED carry a job id, FORGET and GONE a request's seq."""
    return [kind, b"%d" % number]


def forget_frames(seq, error=None):
    return [FORGET, b"%d" % seq, (error or "").encode()]
