"""A TCP proxy that delays what it forwards: the added-latency fault, emulated above TCP.

The kernel here has no netem qdisc (see link.py), so latency is added in user space: the proxy, on its own event
loop in a thread of this process, holds every chunk it reads for `delay` seconds before writing it on, in both
directions, keeping their order. A round trip through it gains about twice `delay`. Unlike netem it delays chunks,
not packets, and it cannot lose a packet: TCP, on both of its legs, never shows it one to lose (which is why loss
is the kernel's, in link.py). A connection broken on one leg is broken on the other with a reset (SO_LINGER 0).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

_CHUNK = 256 * 1024


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset instead of a FIN: the other side learns the connection broke, not that it ended."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


class DelayProxy:
    """Listens on 127.0.0.1 (a free port, `port`) and forwards each connection to `upstream` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.delay = 0.0  # seconds each chunk is held; read when the chunk arrives
        self.delayed = 0  # chunks held so far: proof the fault acted
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # each closes its sockets on the way out

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _connection(self, down_reader: asyncio.StreamReader, down_writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(down_writer)  # the upstream refused: so does the proxy
            return
        legs = [
            asyncio.create_task(self._pipe(down_reader, up_writer, down_writer)),
            asyncio.create_task(self._pipe(up_reader, down_writer, up_writer)),
        ]
        try:
            await asyncio.gather(*legs)
        except (ConnectionError, OSError):
            pass  # both legs were reset
        finally:
            for leg in legs:
                leg.cancel()
            for writer in (up_writer, down_writer):
                writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, source: asyncio.StreamWriter
    ) -> None:
        """Copy `reader` to `writer`, each chunk `delay` after it was read; reset both legs if either breaks."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await held.get()
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while True:
                chunk = await reader.read(_CHUNK)
                held.put_nowait((time.monotonic() + self.delay, chunk))
                self.delayed += bool(self.delay and chunk)
                if not chunk:
                    break
            await sender
        except (ConnectionError, OSError):
            _reset(writer)
            _reset(source)
            raise
        finally:
            sender.cancel()
