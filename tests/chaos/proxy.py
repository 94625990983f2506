"""A small TCP proxy for chaos tests: latency, dropped connections, black holes.

    proxy = Proxy(("127.0.0.1", 5432)).start()   # listens on proxy.port
    proxy.latency = (0.05, 0.2)   # each chunk waits 50-200 ms, each direction
    proxy.drop()                  # close every current connection (the peers see FIN / RST)
    proxy.black_hole = True       # swallow everything both ways, close nothing (no FIN)
    proxy.cut_reply(after=b"tag") # the next COMMIT on the connection that sent b"tag" commits
                                  # on the server; its reply is swallowed, the connection cut

``cut_reply`` reads PostgreSQL's protocol only as far as it must: the server's CommandComplete
for a COMMIT (``C``, length 11, ``COMMIT\0``) is sent once the commit is done, so a cut there
leaves the transaction committed and the client without an answer. The trigger and the reply
are looked for within one chunk (a statement and its reply are one send each, well under the
chunk size).

Threads, two per connection (one per direction), so that a test needs no event loop. What a
black hole here cannot do: withhold TCP ACKs. The proxy's kernel still acknowledges what the
client sends and answers its keepalive probes, so TCP keepalives and ``tcp_user_timeout`` do
not fire through it; only timeouts above TCP (redis-py's ``socket_timeout``, a job's timeout)
do. docs/reliability.md ("Slow and broken networks") says which setting covers which case.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# PostgreSQL's CommandComplete message for COMMIT: type, length (itself and the tag), tag.
COMMIT_COMPLETE = b"C\x00\x00\x00\x0bCOMMIT\x00"


@dataclass
class _Link:
    """One proxied connection: the armed cuts whose trigger its client sent."""

    armed: list[tuple[bytes, bytes]] = field(default_factory=list)


class Proxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.latency: tuple[float, float] | None = None
        self.black_hole = False
        self.connections = 0  # accepted so far
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._rng = random.Random(28)
        self._cuts: list[tuple[bytes, bytes]] = []  # (trigger from the client, reply to cut)
        self.replies_cut = 0

    def cut_reply(self, after: bytes, reply: bytes = COMMIT_COMPLETE) -> None:
        """Once: on a connection whose client sent ``after``, swallow the next server chunk
        holding ``reply`` (``b""``: whatever comes next) and close that connection both ways
        (the server has acted and answered; the client never hears it). Several cuts may be
        armed at once, each fires once; ``replies_cut`` counts the cuts made."""
        with self._lock:
            self._cuts.append((after, reply))

    def start(self) -> Proxy:
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def url_netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    def drop(self) -> int:
        """Close every connection now (both sides); returns how many sockets were closed."""
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        return len(sockets)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            self.connections += 1
            with self._lock:
                self._open.update((client, server))
            link = _Link()
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, link, up), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link, up: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if self.black_hole:
                    continue  # swallowed; nothing closed, nothing sent back
                if self._cuts_here(data, link, up):
                    break  # the reply swallowed; both sides closed below
                self._delay()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if not self.black_hole:  # a black hole never says goodbye
                self._forget(src, dst)

    def _cuts_here(self, data: bytes, link: _Link, up: bool) -> bool:
        if not self._cuts:
            return False
        if up:
            link.armed += [cut for cut in list(self._cuts) if cut[0] in data]
            return False
        for cut in [cut for cut in link.armed if cut[1] in data]:
            link.armed.remove(cut)
            with self._lock:
                if cut not in self._cuts:
                    continue  # fired on another connection
                self._cuts.remove(cut)
                self.replies_cut += 1
            return True
        return False

    def _delay(self) -> None:
        if self.latency is not None:
            time.sleep(self._rng.uniform(*self.latency))

    def _forget(self, *sockets: Any) -> None:
        with self._lock:
            for sock in sockets:
                self._open.discard(sock)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
