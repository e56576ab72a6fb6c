"""What counting a thousand connections by address costs: the kernel's census against reading /proc/self/fd.

Opens 1,000 loopback connections to a listener of this process, then times, three times each: reading every
descriptor of /proc/self/fd as the facade did (readlink, a duplicate, its two addresses), the kernel's census
(client/facade/sockets.py), and shutting down 744 of the connections and then one.

    .venv/bin/python bench/reports/2026-11-29-admission/census_cost.py
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Callable

from tritonnx.client.facade.sockets import census, shut_down

CONNECTIONS = 1000


def descriptor_scan(port: int) -> int:
    """The connections to `port` found by reading each descriptor (the facade's way before the census)."""
    found = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getsockname()[1] == port:
                    sock.getpeername()
                    found += 1
        except OSError:
            continue
    return found


def timed(what: str, run: Callable[[], object]) -> None:
    started = time.perf_counter()
    found = run()
    ms = (time.perf_counter() - started) * 1e3
    print(f"| {what} | {len(found) if isinstance(found, dict) else found} | {ms:.1f} |")


def main() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
    with socket.create_server(("127.0.0.1", 0), backlog=2048) as listener:
        port = listener.getsockname()[1]
        callers, accepted = [], []
        for _ in range(CONNECTIONS):
            callers.append(socket.create_connection(("127.0.0.1", port)))
            accepted.append(listener.accept()[0])
        print("| what | connections | ms |\n|---|---|---|")
        for _ in range(3):
            timed("every descriptor read", lambda: descriptor_scan(port))
        for _ in range(3):
            timed("the kernel's census", lambda: census(port))
        timed("744 shut down", lambda: shut_down({c.getsockname()[:2] for c in callers[256:]}, port))
        timed("1 shut down", lambda: shut_down({callers[100].getsockname()[:2]}, port))
        for sock in callers + accepted:
            sock.close()


if __name__ == "__main__":
    main()
