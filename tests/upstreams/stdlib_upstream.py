#!/usr/bin/env python3
"""An upstream built from the Python standard library only, as a newcomer writes one first.

It is the upstream the request-hygiene tests put behind the gateway, because it is lenient
where real upstreams are:

- it speaks HTTP/1.1 with keep-alive (http.server's own request loop), and reads a request body
  only for methods that usually carry one, so a body sent with GET stays on the connection and
  is read as the next request, as http.server and many frameworks do;
- it maps headers onto a WSGI environ with wsgiref's own code, so `Fencing_Token` and
  `Fencing-Token` both land in HTTP_FENCING_TOKEN (joined with a comma);
- it decodes the path once, as wsgiref does, into PATH_INFO;
- on a path with `forge-reply` in it, it answers with `Fencing-*` headers of its own.

It prints one JSON line per request it acts on ({"kind": "request", ...}) and, when a connection
ends, one line with every byte it received on it ({"kind": "connection", "raw": ...}, the bytes
as latin-1 text). The first line is `listening <address>`.

    stdlib_upstream.py [--listen 127.0.0.1:0]
"""

import io
import json
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

PRINT_LOCK = threading.Lock()
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def emit(record):
    with PRINT_LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


class RecordingSocketReader(io.RawIOBase):
    """The connection's bytes, as read from the socket, kept for the connection's log line."""

    def __init__(self, sock, received):
        self.sock = sock
        self.received = received

    def readable(self):
        return True

    def readinto(self, buffer):
        try:
            n = self.sock.recv_into(buffer)
        except (ConnectionResetError, TimeoutError):
            # The gateway resets an upstream connection it gives up (SO_LINGER 0): that ends it.
            return 0
        self.received.extend(memoryview(buffer)[:n])
        return n


class Handler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10

    def setup(self):
        super().setup()
        self.received = bytearray()
        self.rfile = io.BufferedReader(RecordingSocketReader(self.connection, self.received))

    def handle(self):
        # http.server's keep-alive loop, not wsgiref's one request per connection.
        BaseHTTPRequestHandler.handle(self)

    def finish(self):
        try:
            super().finish()
        finally:
            emit({"kind": "connection", "raw": self.received.decode("latin-1")})

    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.serve
        raise AttributeError(name)

    def serve(self):
        environ = self.get_environ()
        body = b""
        length = environ.get("CONTENT_LENGTH")
        if self.command in BODY_METHODS and length and length.isdigit():
            body = self.rfile.read(int(length))
        headers = {k: v for k, v in environ.items() if k.startswith("HTTP_") or k == "CONTENT_LENGTH"}
        emit(
            {
                "kind": "request",
                "method": self.command,
                "path": self.path,
                "path_info": environ.get("PATH_INFO"),
                "environ": headers,
                "x_request_id": environ.get("HTTP_X_REQUEST_ID"),
                "fencing_token": environ.get("HTTP_FENCING_TOKEN"),
                "body": body.decode("latin-1"),
            }
        )
        answer = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if "forge-reply" in self.path:
            # An upstream (or whoever answers in its place) that claims what only the gateway says.
            for name, value in [("Fencing-Token", "999999"), ("Fencing-Resource", "forged"),
                                ("Fencing-Lease", "x"), ("Fencing-Current-Term", "7"), ("Fencing-Other", "1")]:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer)

    def log_message(self, format, *args):
        pass


class Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    host, port = "127.0.0.1", 0
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--listen":
        host, _, port_text = args[1].rpartition(":")
        port = int(port_text)
    elif args:
        sys.stderr.write("usage: stdlib_upstream.py [--listen HOST:PORT]\n")
        sys.exit(64)
    server = Server((host, port), Handler)
    with PRINT_LOCK:
        sys.stdout.write("listening %s:%d\n" % server.server_address[:2])
        sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
