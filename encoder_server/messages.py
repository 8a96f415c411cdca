"""Frames exchanged between the server's own processes (never seen by clients).

    worker     -> ventilator  [READY]
    ventilator -> worker      [JOB, json]
    ventilator -> sink        [REGISTER, identity, json]  |  [PUBLISH, *public frames]
    worker     -> sink        [PART, json, raw array bytes]
    sink       -> ventilator  [DONE, job_id]
"""
import json
from dataclasses import fields

import numpy as np

from .assembly import Registration
from .scheduling import Job

_JOB_FIELDS = [field.name for field in fields(Job) if field.name != "client"]

READY, JOB, REGISTER, PUBLISH, PART, DONE = b"READY", b"JOB", b"REGISTER", b"PUBLISH", b"PART", b"DONE"


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


def part_frames(seq, job_id, offset, array, tokens=None):
    header = {"seq": seq, "job_id": job_id, "offset": offset, "dtype": str(array.dtype),
              "shape": list(array.shape), "tokens": tokens}
    return [PART, json.dumps(header).encode(), memoryview(np.ascontiguousarray(array)).cast("B")]


def decode_part(header_frame, body_frame):
    header = json.loads(header_frame)
    array = np.frombuffer(body_frame, dtype=header["dtype"]).reshape(header["shape"])
    return header, array


def done_frames(job_id):
    return [DONE, b"%d" % job_id]


