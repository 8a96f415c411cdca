"""What the sync client costs a one-text request, beside the least that ZeroMQ needs for it:

    python -m benchmark.client_cost [--requests 1500] [--rounds 6] [--pieces]

One EncoderClient sends one short text at a time to a server on the zero backend (which runs no
model) and waits for its reply; a raw loop sends the same request's frames on a PUSH socket of its
own and waits on a SUB socket for the reply, reading nothing of it. The two take turns, round by
round, and each round counts the CPU time of the calling thread per request (the sockets' I/O
thread aside, which both need alike). What is left between them is the client's own work: checking
the texts, writing and reading the frames, making the array, watching the connection. With
`--pieces`, two more loops take their turns: the raw loop that also prepares its request as the
client does (checking the texts, writing the JSON frames), and the raw loop that also reads its
reply as the client does (the header's JSON, the array, the Reply).
"""
import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmark import engines, pipeline  # noqa: E402

TEXT = ["a short text of about ten words goes right here"]


def measure(model=None, requests=1500, rounds=6, pieces=False):
    """{WAY_us, WAY_rounds} for each way (client, raw, and with `pieces` raw+prepare and raw+read):
    the calling thread's CPU µs per request, the median and each round's."""
    import zmq

    from encoder_client import EncoderClient
    from encoder_client.protocol import ReplyReader, encode_request, topic
    from encoder_client.request import prepare_encode

    with engines.Service("service (zero backend)", ("--backend", "zero"), model, env=pipeline.ZERO_BACKEND) as server, \
            EncoderClient("127.0.0.1", server.port, server.port_out, timeout=60) as client, \
            zmq.Context() as context:
        identity = b"client-cost"
        push, sub = context.socket(zmq.PUSH), context.socket(zmq.SUB)
        for sock in (push, sub):
            sock.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://127.0.0.1:{server.port}")
        sub.setsockopt(zmq.SUBSCRIBE, topic(identity))
        sub.connect(f"tcp://127.0.0.1:{server.port_out}")
        request = prepare_encode(TEXT)
        req_ids = itertools.count(1)

        def raw(prepared=request):
            push.send_multipart(encode_request(identity, next(req_ids), *prepared))
            if not sub.poll(60_000):
                raise TimeoutError("no reply to the raw loop's request in 60 s")
            return sub.recv_multipart()

        ways = {"client": lambda: client.encode(TEXT), "raw": raw}
        if pieces:
            reader = ReplyReader()
            ways.update({"raw+prepare": lambda: raw(prepare_encode(TEXT)), "raw+read": lambda: reader.read(raw())})
        for way in ways.values():  # each connected and warm
            for _ in range(200):
                way()
        spent = {name: [] for name in ways}
        for round_ in range(rounds):
            for name in (list(ways) if round_ % 2 else list(ways)[::-1]):
                started = time.thread_time()
                for _ in range(requests):
                    ways[name]()
                spent[name].append(round(1e6 * (time.thread_time() - started) / requests, 1))
        push.close()
        sub.close()
    return {**{f"{name}_us": statistics.median(figures) for name, figures in spent.items()},
            **{f"{name}_rounds": figures for name, figures in spent.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model folder (default: the bundled one)")
    parser.add_argument("--requests", type=int, default=1500, help="requests per round and way")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pieces", action="store_true", help="also time the client's preparing and reading apart")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.model, args.requests, args.rounds, args.pieces)))


if __name__ == "__main__":
    main()
