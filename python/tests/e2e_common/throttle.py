"""A TCP proxy that serves at a configured rate: the bytes from the server
to the client flow at rate_bps at most, over all connections together (a
slow or busy remote store in front of a real one, for the load policy).
Requests (client to server) are not slowed. Threads, one pair per
connection; stop() closes everything."""
import socket
import threading
import time


class Throttle:
    def __init__(self, target_host: str, target_port: int, rate_bps: float) -> None:
        self.target = (target_host, target_port)
        self.rate = float(rate_bps)
        self._ln = socket.socket()
        self._ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._ln.bind(("127.0.0.1", 0))
        self._ln.listen(64)
        self.port = self._ln.getsockname()[1]
        self._socks = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._free_at = time.monotonic()  # when the link is free again
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._ln.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(self.target)
            except OSError:
                c.close()
                continue
            self._socks += [c, s]
            threading.Thread(target=self._pump, args=(c, s, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, self.rate), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, rate) -> None:
        chunk = 16384 if rate is None else max(1024, min(65536, int(rate / 50)))
        try:
            while True:
                data = src.recv(chunk)
                if not data:
                    break
                if rate is not None:
                    self._pace(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for x in (src, dst):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _pace(self, n: int) -> None:
        """Waits until n more bytes fit the rate, shared by every connection."""
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + n / self.rate
            wait = self._free_at - now
        if wait > 0:
            time.sleep(wait)

    def stop(self) -> None:
        self._stop.set()
        self._ln.close()
        for x in self._socks:
            try:
                x.close()
            except OSError:
                pass
