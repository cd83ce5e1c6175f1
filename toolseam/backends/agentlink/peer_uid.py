"""Which local user holds the other end of an accepted TCP connection — identd's answer, asked
of this machine's kernel instead of over the network.

An exposed port listens on ``127.0.0.1`` so any client works (curl, a browser), and every local
user reaches ``127.0.0.1``. The kernel keeps, for each TCP socket of this network namespace, the
uid that made it: ``/proc/net/tcp`` lists them, and ``sock_diag`` (netlink, what ``ss`` uses)
looks one up by its exact addresses. The connecting socket is the one whose local end is the
accepted connection's peer and whose remote end is the accepted connection's own address. A
``/proc/net/tcp`` read walks every socket of the machine (13 ms measured here, on the loop of
every connection); the netlink lookup is one hash lookup, so it is the one used.

Only a socket a process still holds counts (inode not 0): a socket its owner closed — or one in
TIME_WAIT, which the kernel reports as uid 0 — proves nothing about who is sending. A peer on
another machine or in another network namespace is not found at all: it has no local owner.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct

_NETLINK_SOCK_DIAG = 4  # linux/netlink.h (the socket module lacks the name)
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NOCOOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2 before its sockid
_SOCKID = struct.Struct(">HH16s16s")  # sport, dport, src, dst (network order) ...
_SOCKID_TAIL = struct.Struct("=III")  # ... if, cookie[2] (host order)
_ANSWER = struct.Struct("=BBBB")  # inet_diag_msg before its sockid: family, state, timer, retrans
_ANSWER_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_SOCKID_SIZE = _SOCKID.size + _SOCKID_TAIL.size

Address = tuple[str, int] | tuple[str, int, int, int]
_Ip = ipaddress.IPv4Address | ipaddress.IPv6Address


def _endpoint(address: Address) -> tuple[_Ip, int]:
    """A socket address as (ip, port), an IPv4-mapped IPv6 address as its IPv4 one."""
    ip = ipaddress.ip_address(address[0].split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(address[1])


def _packed(ip: _Ip, family: int) -> bytes:
    if family == socket.AF_INET6 and isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(f"::ffff:{ip}")  # a dual-stack client's own view
    return ip.packed.ljust(16, b"\0")


def _ask(family: int, local: tuple[_Ip, int], remote: tuple[_Ip, int]) -> int | None:
    """The uid of the one open TCP socket of ``family`` at ``local`` connected to ``remote``."""
    sockid = _SOCKID.pack(local[1], remote[1], _packed(local[0], family),
                          _packed(remote[0], family)) + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE)
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as link:
        link.sendto(_HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST,
                                 1, 0) + body, (0, 0))
        answer = link.recv(8192)
    _, kind, _, _, _ = _HEADER.unpack_from(answer)
    if kind == _NLMSG_ERROR:
        code = -struct.unpack_from("=i", answer, _HEADER.size)[0]
        if code == errno.ENOENT:
            return None
        raise OSError(code, f"sock_diag: {errno.errorcode.get(code, code)}")
    offset = _HEADER.size + _ANSWER.size
    if answer[offset:offset + _SOCKID.size] != sockid[:_SOCKID.size]:
        return None  # another socket than the one asked for (a listener): not the peer
    _, _, _, uid, inode = _ANSWER_TAIL.unpack_from(answer, offset + _SOCKID_SIZE)
    return uid if inode else None  # inode 0: no process holds it (closed, TIME_WAIT)


def connecting_uid(peer: Address, ours: Address) -> int | None:
    """The uid of the open local socket whose local end is ``peer`` and whose remote end is
    ``ours`` (an accepted connection's ``getpeername()`` and ``getsockname()``); None when no
    such socket is open in this network namespace (another machine, another namespace, or a
    client that already closed)."""
    local, remote = _endpoint(peer), _endpoint(ours)
    families = ((socket.AF_INET, socket.AF_INET6) if isinstance(local[0], ipaddress.IPv4Address)
                else (socket.AF_INET6,))
    for family in families:  # an IPv4 peer: a plain IPv4 socket, or a dual-stack IPv6 one
        uid = _ask(family, local, remote)
        if uid is not None:
            return uid
    return None


__all__ = ["connecting_uid"]
