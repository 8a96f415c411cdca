"""CURVE encryption and authentication for the public sockets (ZeroMQ's ZAP handler via zmq.auth).

`encoder-server keygen` writes key pairs in zmq.auth's certificate format: NAME.key holds the
public key, NAME.key_secret both keys. The server loads its secret file; clients are allowed
when their public key file is in the --authorized-clients folder. The server's own key is always
allowed: its local workers and its built-in HTTP gateway connect with it.
"""
import ipaddress
import os

import zmq
import zmq.auth


def keygen(directory, name):
    """Write NAME.key and NAME.key_secret in `directory`, unless that pair exists already (it is
    kept: a container that runs keygen at each start keeps its keys); returns their paths and
    whether they were written."""
    public, secret = (os.path.join(directory, f"{name}.{suffix}") for suffix in ("key", "key_secret"))
    if os.path.exists(public) and os.path.exists(secret):
        load_key_pair(secret)  # a damaged pair is an error, not something to keep
        return public, secret, False
    os.makedirs(directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return public, secret, True


def load_key_pair(secret_file):
    public, secret = zmq.auth.load_certificate(secret_file)
    if secret is None:
        raise ValueError(f"{secret_file} holds no secret key; pass the .key_secret file")
    return public, secret


class _AllowedKeys:
    """zmq.auth's CURVE callback: the keys of a folder of .key files plus the server's own."""

    def __init__(self, folder, own_public):
        self.allowed = {*zmq.auth.load_certificates(folder), own_public} if folder else None

    def callback(self, domain, client_key):
        return self.allowed is None or client_key in self.allowed


def start_authenticator(context, authorized_clients, own_public):
    """Check every CURVE client against the public keys in `authorized_clients` and our own
    (or accept any key, for encryption alone, when it is None)."""
    from zmq.auth.thread import ThreadAuthenticator  # here: it imports asyncio, which only CURVE needs
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback(domain="*", credentials_provider=_AllowedKeys(authorized_clients,
                                                                                           own_public))
    return authenticator


def curve_for(context, settings):
    """(key pair for make_socket's `curve`, authenticator to stop on close) for a process with
    public sockets; (None, None) when the server runs without --server-key."""
    if not settings.server_key:
        return None, None
    pair = load_key_pair(settings.server_key)
    return pair, start_authenticator(context, settings.authorized_clients, pair[0])


def own_client_keys(settings):
    """(server public, public, secret) for the server's own processes to connect to its CURVE
    sockets as a client, or None without --server-key."""
    if not settings.server_key:
        return None
    public, secret = load_key_pair(settings.server_key)
    return public, public, secret


def workers_use_curve(settings):
    """Worker sockets are encrypted when they are open to other hosts on a CURVE server."""
    return bool(settings.server_key and settings.worker_port)


def is_loopback(peer_address):
    """Whether a peer's address (as ZeroMQ reports it) is this host's loopback, IPv4 or IPv6."""
    try:
        address = ipaddress.ip_address(peer_address or "")
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
