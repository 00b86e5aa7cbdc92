"""NCCL log lines made with NCCL's own format strings, for the tests of the fabric report.

Every format string below is copied from NVIDIA/nccl at tag v2.30.7-1 (commit 73cf112295c3),
file named beside it; C's printf and Python's ``%`` agree on the ``%s``/``%d`` used here. NCCL
formats in two steps (the prefix with the call site's format inserted, then the arguments):
the same text, as long as the hostname holds no ``%`` (NCCL replaces it with ``-``).
"""

from __future__ import annotations

# src/debug.cc, ncclDebugLogV.
PREFIX = "%s:%d:%d "  # hostname, pid, tid
INFO = "[%d] NCCL INFO %s\n"  # cudaDev, message
WARN = "[%d] %s:%d (%s) NCCL WARN %s\n"  # cudaDev, file, line, function, message
TIMESTAMP = "[%F %T] "  # NCCL_DEBUG_TIMESTAMP_FORMAT's default (strftime)

# The messages (call site: format).
USING_NETWORK = "Using network %s"  # src/init.cc
IB_USING = "NET/IB : Using%s %s; OOB %s:%s"  # src/transport/net_ib/init.cc
IB_DEVICE = " [%d]%s:%d"  # src/transport/net_ib/init.cc, per device ...
IB_LINK = "/%s"  # ... and its link layer, NCCL_IB_LLSTR: "IB" or "RoCE"
IB_NO_DEVICE = "NET/IB : No device found."  # src/transport/net_ib/init.cc
SOCKET_USING = "NET/Socket : Using%s"  # src/transport/net_socket.cc
SOCKET_DEVICE = " [%d]%s:%s"  # src/transport/net_socket.cc, per interface
SOCKET_ADDRESS = "%s<%s>"  # src/misc/socket.cc, ncclSocketToString
PLUGIN_INITIALIZED = "Initialized NET plugin %s"  # src/plugin/net.cc
PLUGIN_FAILED = "Failed to initialize NET plugin %s"  # src/plugin/net.cc
PLUGIN_ASSIGNED = "Assigned NET plugin %s to comm"  # src/plugin/net.cc
VERSION = "NCCL version %d.%d.%d%s+cuda%d.%d"  # src/init.cc, VERSION_STRING

HOST, PID, TID = "gpu-node-3", 4242, 4301


def info(message: str, host: str = HOST, pid: int = PID, tid: int = TID, dev: int = 0) -> str:
    return PREFIX % (host, pid, tid) + INFO % (dev, message)


def warn(message: str, host: str = HOST, pid: int = PID, tid: int = TID, dev: int = 0) -> str:
    # WARN lines start with a newline and, by default, a timestamp.
    stamp = "[2026-06-11 11:44:19] "
    where = ("transport/net_ib/init.cc", 300, "ncclIbInit")
    return "\n" + stamp + PREFIX % (host, pid, tid) + WARN % (dev, *where, message)


def ib_using(devices: list[tuple[str, int, str]], oob: str = "eth0", ro: bool = False) -> str:
    line = "".join(
        IB_DEVICE % (i, name, port) + IB_LINK % link for i, (name, port, link) in enumerate(devices)
    )
    address = SOCKET_ADDRESS % ("10.0.0.3", "0")
    return IB_USING % (line, "[RO]" if ro else "", oob, address)


def socket_using(interfaces: list[str]) -> str:
    line = "".join(
        SOCKET_DEVICE % (i, name, SOCKET_ADDRESS % (f"10.0.0.{i + 3}", "0"))
        for i, name in enumerate(interfaces)
    )
    return SOCKET_USING % line


def version_message() -> str:
    return VERSION % (2, 30, 7, "", 13, 0)


def ib_log(pid: int = PID) -> list[str]:
    """One rank's INIT,NET lines when InfiniBand works (two ConnectX ports)."""
    return [
        info(version_message(), pid=pid),
        info(ib_using([("mlx5_0", 1, "IB"), ("mlx5_1", 1, "IB")], ro=True), pid=pid),
        info(PLUGIN_INITIALIZED % "IB", pid=pid),
        info(PLUGIN_ASSIGNED % "IB", pid=pid),
        info(USING_NETWORK % "IB", pid=pid),
    ]


def socket_fallback_log(pid: int = PID) -> list[str]:
    """One rank's lines when InfiniBand finds no device and NCCL takes TCP sockets."""
    return [
        info(version_message(), pid=pid),
        info(IB_NO_DEVICE, pid=pid),
        info(ib_using([]), pid=pid),
        info(PLUGIN_FAILED % "IB", pid=pid),
        info(socket_using(["eth0"]), pid=pid),
        info(PLUGIN_INITIALIZED % "Socket", pid=pid),
        info(PLUGIN_ASSIGNED % "Socket", pid=pid),
        info(USING_NETWORK % "Socket", pid=pid),
    ]
