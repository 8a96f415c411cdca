"""CURVE encryption and authentication for the public sockets (ZeroMQ's ZAP handler via zmq.auth).

`encoder-server keygen` writes key pairs in zmq.auth's certificate format: NAME.key holds the
public key, NAME.key_secret both keys. The server loads its secret file; clients are allowed
when their public key file is in the --authorized-clients folder.
"""
import os

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


def keygen(directory, name):
    """Write NAME.key and NAME.key_secret in `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return public, secret


def load_key_pair(secret_file):
    public, secret = zmq.auth.load_certificate(secret_file)
    if secret is None:
        raise ValueError(f"{secret_file} holds no secret key; pass the .key_secret file")
    return public, secret


def start_authenticator(context, authorized_clients):
    """Check every CURVE client against the public keys in `authorized_clients`
    (or accept any key, for encryption alone, when it is None)."""
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=authorized_clients or zmq.auth.CURVE_ALLOW_ANY)
    return authenticator


def curve_for(context, settings):
    """(key pair for make_socket's `curve`, authenticator to stop on close) for a process with
    public sockets; (None, None) when the server runs without --server-key."""
    if not settings.server_key:
        return None, None
    return load_key_pair(settings.server_key), start_authenticator(context, settings.authorized_clients)
