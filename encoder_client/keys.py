"""Client identities and CURVE keys, shared by the sync and asyncio clients."""
import os
import uuid

import zmq
import zmq.auth

from .protocol import check_identity


def as_identity(identity):
    """The client's identity, as bytes: random unless given (clients sharing one multicast). A
    given one is checked (protocol.check_identity) before anything is sent."""
    if identity is None:
        return str(uuid.uuid4()).encode("ascii")
    return check_identity(identity)


def curve_keys(server_key, client_key):
    """(server public, client public, client secret) for CURVE, or None without a server key."""
    if server_key is None:
        if client_key is not None:
            raise ValueError("client_key needs server_key, the server's public key file")
        return None
    server_public = zmq.auth.load_certificate(server_key)[0] if _is_file(server_key) else _as_bytes(server_key)
    if client_key is None:
        return (server_public, *zmq.curve_keypair())  # encryption alone, for a server that admits any key
    client_public, client_secret = zmq.auth.load_certificate(client_key)
    if client_secret is None:
        raise ValueError(f"{client_key} holds no secret key; pass the client's .key_secret file")
    return server_public, client_public, client_secret


def apply_curve(sock, curve):
    if curve:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = curve


def _is_file(value):
    return isinstance(value, (str, os.PathLike)) and os.path.isfile(value)


def _as_bytes(value):
    return value.encode() if isinstance(value, str) else bytes(value)
