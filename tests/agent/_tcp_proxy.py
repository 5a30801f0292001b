"""A loopback TCP proxy that can cut a connection at a chosen client message.

Used to lose a PostgreSQL connection at an exact point of a write: ``arm(trigger,
forward)`` makes the proxy, on the next client chunk containing ``trigger`` (or the
next chunk at all when ``trigger`` is None), either forward it and then cut the link
(the server still gets the message; the client never hears back), or cut the link
without forwarding it.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.services._proc import free_port


class CuttingProxy:
    """Forwards 127.0.0.1:port to 127.0.0.1:target; ``arm`` cuts the next matching chunk."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._trigger: bytes | None = None
        self._armed = False
        self._forward = True
        self.cuts = 0
        self._closed = False
        self._sockets: list[socket.socket] = []  # all closed by close()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, trigger: bytes | None, forward: bool) -> None:
        with self._lock:
            self._armed, self._trigger, self._forward = True, trigger, forward

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._upstream, args=(client, server), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client),
                             daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_WR)
                return
            with self._lock:
                cut = self._armed and (self._trigger is None or self._trigger in data)
                forward = self._forward
                if cut:
                    self._armed = False
                    self.cuts += 1
            if cut:
                if forward:
                    server.sendall(data)
                    # FIN after the message (not RST): the server reads and runs it first.
                    with contextlib.suppress(OSError):
                        server.shutdown(socket.SHUT_WR)
                else:
                    with contextlib.suppress(OSError):
                        server.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                return
            try:
                server.sendall(data)
            except OSError:
                return

    def _downstream(self, server: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                return
            # Once the client side is cut, the server's answers drain into nothing.
            with contextlib.suppress(OSError):
                client.sendall(data)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
