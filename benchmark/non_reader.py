"""What a client that never reads costs the sink: its peak memory while such a client sends
request after request of large results, with bert-serving-client's frames (each result whole)
and with ours (protocol 2, in chunks).

    python -m benchmark.non_reader [--model DIR] [--requests 12 40] [--max-result-mb 16]

The server runs token-level pooling (`--pooling-strategy none`), so that a few texts make a
large result: each request asks for as many texts as fit in --max-result-mb. A SUB socket that
keeps next to nothing itself (RCVHWM 1, a 64 KB kernel buffer) subscribes and never reads. It
prints the sink's resident memory before and at its peak, and what the server did with the
requests (served, abandoned, replies dropped).
"""
import argparse
import json
import time
import uuid

import psutil
import zmq

from encoder_client import EncoderClient

from .corpus import texts
from .engines import Service


def sink_pid(service):
    """The child of a running server (an engines.Service, or the tests' RunningServer) that listens
    on the result port: the sink."""
    for child in psutil.Process(service.process.pid).children(recursive=True):
        if any(c.laddr.port == service.port_out and c.status == psutil.CONN_LISTEN for c in child.net_connections()):
            return child.pid
    raise RuntimeError("no process listens on the result port")


def rss_mb(pid, peak=False):
    """The resident memory of process `pid` now (VmRSS), or its peak so far (VmHWM), in MB."""
    field = "VmHWM:" if peak else "VmRSS:"
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field))


def run(service, requests, legacy, texts_per_request):
    """Send `requests` requests from a client that never reads; returns one line of figures."""
    context = zmq.Context()
    identity = str(uuid.uuid4()).encode()  # what bert-serving-client subscribes to, bare
    sub = context.socket(zmq.SUB)
    for option, value in ((zmq.RCVHWM, 1), (zmq.RCVBUF, 64 << 10), (zmq.LINGER, 0)):
        sub.setsockopt(option, value)
    sub.setsockopt(zmq.SUBSCRIBE, identity if legacy else identity + b"\0")
    sub.connect(f"tcp://127.0.0.1:{service.port_out}")
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://127.0.0.1:{service.port}")
    sink = sink_pid(service)
    time.sleep(1)
    base = rss_mb(sink)
    payload = json.dumps(texts("medium", texts_per_request)).encode()
    options = [] if legacy else [b'{"v": 2}']
    with EncoderClient("127.0.0.1", service.port, service.port_out, timeout=60) as client:
        before = client.server_status
        for req_id in range(requests):
            push.send_multipart([identity, payload, b"%d" % req_id, b"%d" % texts_per_request, *options])
        time.sleep(1)
        while client.server_status["in_flight_requests"]:
            time.sleep(0.5)
        after = client.server_status
    context.destroy(linger=0)
    served = after["requests_served"] - before["requests_served"]
    abandoned = after["requests"]["abandoned"] - before["requests"]["abandoned"]
    dropped = after["replies_dropped"] - before["replies_dropped"]
    peak = rss_mb(sink, peak=True)
    return (f"{'bert-serving-client' if legacy else 'protocol 2':19}: {requests:3d} requests, sink {base:.0f} MB "
            f"-> peak {peak:.0f} MB (+{peak - base:.0f}); served {served}, abandoned {abandoned}, "
            f"replies dropped {dropped}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--requests", type=int, nargs="+", default=[12, 40])
    parser.add_argument("--max-result-mb", type=int, default=16)
    args = parser.parse_args(argv)
    for legacy in (True, False):
        for requests in args.requests:
            flags = ("--pooling-strategy", "none", "--max-result-mb", str(args.max_result_mb),
                     "--max-pending-texts", "1000000")
            with Service("non-reader", flags, model=args.model) as service:
                with EncoderClient("127.0.0.1", service.port, service.port_out, timeout=60) as client:
                    config = client.server_config
                per_text = config["truncate_at"] * config["embedding_dim"] * 4
                count = max(1, (args.max_result_mb << 20) // per_text - 1)
                if requests == args.requests[0] and legacy:
                    print(f"results of {count} texts, {count * per_text / 2**20:.1f} MB each; the sink keeps at "
                          f"most {config['max_unread_mb']} MB unread per client", flush=True)
                print(run(service, requests, legacy, count), flush=True)


if __name__ == "__main__":
    main()
