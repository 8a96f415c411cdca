"""Frames exchanged between the server's own processes (never seen by clients).

    worker     -> ventilator  [READY]
    ventilator -> worker      [JOB, json]
    ventilator -> sink        [REGISTER, identity, json]  |  [PUBLISH, *public frames]
    worker     -> sink        [PART, json, raw array bytes]
    sink       -> ventilator  [DONE, job_id]
"""
import json

import numpy as np

from .assembly import Registration

READY, JOB, REGISTER, PUBLISH, PART, DONE = b"READY", b"JOB", b"REGISTER", b"PUBLISH", b"PART", b"DONE"


def job_frames(job):
    fields = {"job_id": job.job_id, "seq": job.seq, "offset": job.offset, "texts": job.texts,
              "priority": job.priority, "is_tokenized": job.is_tokenized, "with_tokens": job.with_tokens}
    return [JOB, json.dumps(fields).encode()]


def decode_job(frames):
    return json.loads(frames[1])


def register_frames(seq, registration):
    fields = {"seq": seq, "req_id": registration.req_id, "rows": registration.rows,
              "with_tokens": registration.with_tokens}
    return [REGISTER, registration.identity, json.dumps(fields).encode()]


def decode_register(frames):
    fields = json.loads(frames[2])
    seq = fields.pop("seq")
    return seq, Registration(identity=frames[1], **fields)


def part_frames(seq, job_id, offset, array, tokens=None):
    header = {"seq": seq, "job_id": job_id, "offset": offset, "dtype": str(array.dtype),
              "shape": list(array.shape), "tokens": tokens}
    return [PART, json.dumps(header).encode(), memoryview(np.ascontiguousarray(array)).cast("B")]


def decode_part(frames):
    header = json.loads(frames[1])
    array = np.frombuffer(frames[2], dtype=header["dtype"]).reshape(header["shape"])
    return header, array


def done_frames(job_id):
    return [DONE, b"%d" % job_id]


