"""A TCP relay that can go silent for a while, like a host whose network drops: `Partition(host, port)` listens on
127.0.0.1 and relays each connection to (host, port); `silence(seconds)` holds every byte in both directions for that
long (neither side sees a reset or an error, as when packets are lost and TCP retransmits), then lets them flow."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Partition:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.held_s = 0.0  # how long bytes were held, in all
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, name="partition-accept", daemon=True).start()

    def silence(self, seconds: float) -> None:
        """Hold every byte for `seconds` from now (returns at once)."""
        self._open.clear()
        began = time.monotonic()

        def reopen() -> None:
            self.held_s += time.monotonic() - began
            self._open.set()

        threading.Timer(seconds, reopen).start()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        for s in [self.server, *self._socks]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            up = socket.create_connection(self.target)
            self._socks += [down, up]
            self.connections += 1
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(src, dst), name="partition-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._open.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()  # bytes received while silent are held until the network is back
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
