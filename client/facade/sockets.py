"""The facade's accepted TCP connections: who they come from, and ending one.

The census asks the kernel (NETLINK_SOCK_DIAG, what `ss` reads) for the connections to the facade's port: one
request a second whatever their number, where reading each descriptor in /proc/self/fd costs a few system calls a
socket on the event loop (tens of milliseconds for a thousand connections). The port is the facade's alone (gRPC's
SO_REUSEPORT is off), so every connection to it in the process's network namespace is one of its own.

gRPC's Python server cannot end one connection (no GOAWAY of the application's own), so the facade shuts its socket
down: a duplicate of gRPC's descriptor, found in /proc/self/fd by the inode the census gave and checked by its
peer's address, gets `shutdown`, which gRPC sees as the peer hanging up. Without the census (a sandbox that refuses
socket diagnostics) every socket's addresses are read instead.
"""

from __future__ import annotations

import os
import socket
import struct

Caller = tuple[str, int]  # a connection's peer: (host, port)

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 0x2, 0x3
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
# inet_diag_req_v2: family, protocol, extensions, padding, states; then the socket id (ports, addresses, interface,
# cookie) left zero: a dump filters by the bytecode below.
_REQUEST = struct.Struct("=BBBxI48x")
_ATTRIBUTE = struct.Struct("=HH")  # length, type
_REQ_BYTECODE = 1
# Bytecode "source port >= P, then <= P", each op (code, jump if true, jump if false) followed by one holding P; a
# jump to the end (its length + 4) rejects.
_BC_S_GE, _BC_S_LE = 2, 3
_OP = struct.Struct("=BBH")
# The states of a connection gRPC holds open: ESTABLISHED, and CLOSE_WAIT (the caller has closed its end). Once the
# facade's end has closed or been shut down (FIN_WAIT, CLOSING, LAST_ACK) the connection is on its way out, and the
# kernel may keep it for a minute after gRPC let go of it; counting it would hold its address's place.
_STATES = (1 << 1) | (1 << 8)
# inet_diag_msg: family, (state, timer, retransmits, source port), the peer's port (big-endian), (source address), the
# peer's address, (interface, cookie, expiry, queues, uid), the inode.
_MESSAGE = struct.Struct("=B3x2x2s16x16s4x8x16xI")


def _request(family: int, port: int) -> bytes:
    bytecode = b"".join(
        (_OP.pack(_BC_S_GE, 8, 20), _OP.pack(0, 0, port), _OP.pack(_BC_S_LE, 8, 12), _OP.pack(0, 0, port))
    )
    body = (
        _REQUEST.pack(family, socket.IPPROTO_TCP, 0, _STATES)
        + _ATTRIBUTE.pack(_ATTRIBUTE.size + len(bytecode), _REQ_BYTECODE)
        + bytecode
    )
    return (
        _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
        + body
    )


def _host(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    return socket.inet_ntop(socket.AF_INET6, raw).removeprefix("::ffff:")  # gRPC's sockets are dual-stack


def census(local_port: int) -> dict[Caller, int]:
    """The open connections to `local_port` a process holds: caller (host, port) -> socket inode.

    OSError if the kernel refuses the request.
    """
    found: dict[Caller, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as diag:
        for family in (socket.AF_INET, socket.AF_INET6):
            diag.send(_request(family, local_port))
            while (chunk := diag.recv(1 << 16)) and _read(chunk, found):
                pass
    return found


def _read(chunk: bytes, found: dict[Caller, int]) -> bool:
    """Add the chunk's sockets to `found`; False once the dump is done."""
    offset = 0
    while offset + _NLMSG_HEADER.size <= len(chunk):
        length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(chunk, offset)
        if kind == _NLMSG_DONE:
            return False
        if kind == _NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", chunk, offset + _NLMSG_HEADER.size)
            raise OSError(-code, f"socket diagnostics refused the request: {os.strerror(-code)}")
        family, remote_port, remote, inode = _MESSAGE.unpack_from(chunk, offset + _NLMSG_HEADER.size)
        if inode:  # 0: no process holds it (not accepted yet, or let go of)
            found[(_host(family, remote), int.from_bytes(remote_port, "big"))] = inode
        offset += (length + 3) & ~3
    return True


def shut_down(peers: set[Caller], local_port: int, counted: dict[Caller, int] | None = None) -> int:
    """Shut down this process's connections from `peers` to `local_port`; how many were found.

    `counted`: a census just taken, else one is taken here.
    """
    try:
        found = census(local_port) if counted is None else counted
        inodes: set[int] | None = {inode for caller, inode in found.items() if caller in peers}
    except OSError:
        inodes = None  # no census: every socket's addresses are read
    done = 0
    for name in os.listdir("/proc/self/fd"):
        if done == len(peers) or inodes == set():
            break  # the rest of the descriptors need no system calls
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            if not link.startswith("socket:[") or (inodes is not None and int(link[8:-1]) not in inodes):
                continue
            if inodes is not None:
                duplicate = os.dup(int(name))
                # Still the socket the census named, not one that took its number since: then no family is needed.
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=duplicate)
                ours = os.fstat(duplicate).st_ino == int(link[8:-1])
            else:
                sock = socket.socket(fileno=os.dup(int(name)))
                ours = _from(sock, peers, local_port)
            with sock:
                if ours:
                    sock.shutdown(socket.SHUT_RDWR)
                    done += 1
        except OSError:
            continue  # closed meanwhile, or the listening socket (no peer)
    return done


def _from(sock: socket.socket, peers: set[Caller], local_port: int) -> bool:
    """Whether `sock` is a connection to `local_port` from one of `peers`."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.getsockname()[1] != local_port:
        return False
    host, port = sock.getpeername()[:2]
    return (host.removeprefix("::ffff:"), port) in peers
