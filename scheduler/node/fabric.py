"""ftconsole fabric test: timed TCP streams between the nodes of a set, one node's side printed as one JSON line.

Protocol
--------
The scheduler runs this file on every node of the set at once, over SSH, as ``python3 -`` with PARAMS prepended
(``bundle.python_stdin_script``); run as a plain script, PARAMS comes from argv[1]. PARAMS keys:

    index    this node's place in hosts
    hosts    every node's address, in ring order (the address a launcher's MASTER_ADDR uses)
    port     the TCP port each node listens on, at its own address
    shifts   the ring distances this node sends to, one after the other (default [1]); node i sends to
             hosts[(i + s) % n] for each s, and receives from hosts[(i - s) % n]
    seconds  how long each stream sends (default 2)
    timeout  seconds the whole test may take on this node (default 60)
    token    a secret of this test, sent first on each stream: a connection without it is not counted (another
             process of the node that connects to the port proves nothing about the fabric)
    after    true: send only once the streams to this node were received (default false). With two nodes the
             second waits for the first's stream, so that the two directions are measured one after the other:
             at once, a node's stream out would slow its acknowledgements of the stream in, and a node with a slow
             way out would make its partner look slow too

Each node listens on (its address, port), sends one stream per shift for `seconds`, each after the one before has
been read whole by its receiver, and measures each stream it receives from its first byte to its end. It prints::

    {"fabric": 1, "index": 0, "received": [{"from": 2, "shift": 1, "bytes": 123, "seconds": 2.01}],
     "sent": [{"to": 1, "shift": 1, "bytes": 123, "seconds": 2.0, "error": null}], "error": null}

A stream that never came is missing from "received"; "error" names why the node could not take part at all (its
port taken, its parameters wrong). The exit status is 0 whenever the line was printed.

Python 3.8, standard library only; no ``from __future__``. Bundled with agent_common.py (``bundle.script``); the
modules share one namespace, so this file's private names start with ``_fb_``.
"""

import errno
import hmac
import json
import socket
import sys
import threading
import time

from ftconsole.scheduler.node.agent_common import as_number, merged_params, print_one_line  # bundled

FABRIC_PROTOCOL = 1
DEFAULT_FABRIC_PARAMS = {"index": 0, "hosts": [], "port": 29510, "shifts": [1], "seconds": 2.0, "timeout": 60.0,
                         "token": "", "after": False}  # fmt: skip
FABRIC_CHUNK = 1 << 20  # bytes per send and per receive
FABRIC_HEADER_MAX = 512  # bytes of a stream's first line: {"token": ..., "from": i, "shift": s}
FABRIC_CONNECT_RETRY_S = 0.05


class _FbDeadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def remaining(self):
        return max(0.0, self.end - time.monotonic())


def _fb_listen(host, port):
    """A listening socket at (host, port), else at every address of the node when `host` is not one of its own
    (an address behind NAT, a name the node resolves elsewhere)."""
    for address in (host, ""):
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL and address:
                continue
            raise
        sock.listen(64)
        return sock
    raise OSError(errno.EADDRNOTAVAIL, "no address to listen on")


def _fb_read_header(conn, deadline):
    data = b""
    while b"\n" not in data:
        conn.settimeout(max(0.01, deadline.remaining()))
        more = conn.recv(FABRIC_HEADER_MAX)
        if not more or len(data) + len(more) > FABRIC_HEADER_MAX:
            return None, b""
        data += more
    line, rest = data.split(b"\n", 1)
    try:
        header = json.loads(line.decode("utf-8"))
    except ValueError:
        return None, b""
    return (header if isinstance(header, dict) else None), rest


def _fb_receive(conn, token, deadline, received, lock):
    """Read one stream: counted only when its header carries the test's token."""
    try:
        header, rest = _fb_read_header(conn, deadline)
        if header is None or not hmac.compare_digest(str(header.get("token", "")), token):
            return
        buf = bytearray(FABRIC_CHUNK)
        total, first, last = len(rest), (time.monotonic() if rest else None), time.monotonic()
        while True:
            conn.settimeout(max(0.01, deadline.remaining()))
            n = conn.recv_into(buf)
            if not n:
                break
            last = time.monotonic()
            if first is None:
                first = last
            total += n
        conn.sendall(b"ok\n")  # the sender's next stream starts after this one is read whole
        seconds = (last - first) if first is not None else 0.0
        with lock:
            received.append({"from": header.get("from"), "shift": header.get("shift"), "bytes": total,
                             "seconds": round(seconds, 4)})  # fmt: skip
    except OSError:
        return
    finally:
        conn.close()


def _fb_accept(listener, token, deadline, expected, received, lock):
    """Accept streams until `expected` were counted or the deadline passes."""
    threads = []  # type: list[threading.Thread]
    listener.settimeout(FABRIC_CONNECT_RETRY_S * 2)
    while deadline.remaining() > 0:
        with lock:
            if len(received) >= expected:
                break
        try:
            conn, _peer = listener.accept()
        except socket.timeout:
            continue
        except OSError:
            break
        if len(threads) >= expected * 8:  # strangers keep connecting: none of them is read
            conn.close()
            continue
        conn.setblocking(True)
        thread = threading.Thread(target=_fb_receive, args=(conn, token, deadline, received, lock), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(deadline.remaining())


def _fb_connect(host, port, deadline):
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.01, deadline.remaining()))
        except OSError:
            if deadline.remaining() <= FABRIC_CONNECT_RETRY_S:
                raise
            time.sleep(FABRIC_CONNECT_RETRY_S)  # its listener is not up yet: its SSH session starts later


def _fb_send(host, port, header, seconds, deadline):
    """One stream of `seconds` to (host, port); (bytes, seconds, error)."""
    payload = memoryview(bytes(FABRIC_CHUNK))
    sent, started = 0, time.monotonic()
    try:
        with _fb_connect(host, port, deadline) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(max(0.01, deadline.remaining()))
            sock.sendall(json.dumps(header).encode("utf-8") + b"\n")
            started = time.monotonic()
            until = started + seconds
            while time.monotonic() < until:
                sock.settimeout(max(0.01, deadline.remaining()))
                sock.sendall(payload)
                sent += FABRIC_CHUNK
            took = time.monotonic() - started
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(max(0.01, deadline.remaining()))
            if not sock.recv(16).startswith(b"ok"):
                return sent, took, "the receiver did not confirm the stream"
            return sent, took, None
    except OSError as exc:
        return sent, time.monotonic() - started, "%s:%s: %s" % (host, port, exc.strerror or exc)


def run_fabric(params):
    deadline = _FbDeadline(as_number(params.get("timeout")) or 60.0)
    hosts, index = params.get("hosts"), params.get("index")
    shifts, seconds = params.get("shifts"), as_number(params.get("seconds"))
    port, token = params.get("port"), str(params.get("token") or "")
    doc = {"fabric": FABRIC_PROTOCOL, "index": index, "received": [], "sent": [], "error": None}
    if (not isinstance(hosts, list) or len(hosts) < 2 or not isinstance(index, int) or not 0 <= index < len(hosts)
            or not isinstance(shifts, list) or not all(isinstance(s, int) and s % len(hosts) for s in shifts)
            or not seconds or seconds <= 0 or not isinstance(port, int) or not token):  # fmt: skip
        doc["error"] = "bad parameters: index %r of hosts %r, shifts %r, seconds %r, port %r" % (
            index, hosts, shifts, seconds, port)  # fmt: skip
        return doc
    n = len(hosts)
    try:
        listener = _fb_listen(str(hosts[index]), port)
    except OSError as exc:
        doc["error"] = "cannot listen on port %d: %s" % (port, exc.strerror or exc)
        return doc
    lock = threading.Lock()
    receiver = threading.Thread(target=_fb_accept, args=(listener, token, deadline, len(shifts), doc["received"],
                                                         lock), daemon=True)  # fmt: skip
    receiver.start()
    try:
        while params.get("after") is True and receiver.is_alive() and deadline.remaining() > 0:
            with lock:
                if len(doc["received"]) >= len(shifts):
                    break
            time.sleep(FABRIC_CONNECT_RETRY_S)
        for shift in shifts:
            to = (index + shift) % n
            header = {"token": token, "from": index, "shift": shift}
            sent, took, error = _fb_send(str(hosts[to]), port, header, seconds, deadline)
            doc["sent"].append({"to": to, "shift": shift, "bytes": sent, "seconds": round(took, 4), "error": error})
        receiver.join(deadline.remaining())
    finally:
        listener.close()
    with lock:
        doc["received"] = list(doc["received"])
    return doc


def load_fabric_params(argv):
    return merged_params(argv, globals().get("PARAMS"), DEFAULT_FABRIC_PARAMS)[0]


def main(argv):
    return print_one_line("fabric", load_fabric_params, run_fabric, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
