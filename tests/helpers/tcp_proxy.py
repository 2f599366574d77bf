"""A TCP proxy between a service and its server that can stop forwarding: a server, or a network, that has
stopped answering without closing anything.

    with TcpProxy("127.0.0.1", 55432) as proxy:       # the service connects to 127.0.0.1:proxy.port
        proxy.freeze()                                 # bytes are read and held, never delivered
        wait_until(lambda: proxy.held > 0, ...)        # the service has sent something it waits on

While frozen, new connections are accepted (the kernel would accept them anyway) and get nothing further;
what either side sends is held. `thaw()` delivers what was held and forwards again; leaving the block
drops every connection (the server sees its clients gone and rolls their transactions back).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.held = 0  # bytes read while frozen (delivered only by thaw)
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def freeze(self) -> None:
        """Stop forwarding: from now on, what either side sends is held."""
        self._loop.call_soon_threadsafe(self._set_flowing, False)

    def thaw(self) -> None:
        """Deliver what was held, and forward again."""
        self._loop.call_soon_threadsafe(self._set_flowing, True)

    def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.ensure_future(self._serve(client_r, client_w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        server_w: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # frozen: the connection is accepted, and goes nowhere
            server_r, server_w = await asyncio.open_connection(*self.target)
            await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (client_w, server_w):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await w.wait_closed()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        while data := await r.read(65536):
            if not self._flowing.is_set():
                self.held += len(data)
                await self._flowing.wait()
            w.write(data)
            await w.drain()
        if w.can_write_eof():
            w.write_eof()
