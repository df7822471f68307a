"""Slow HTTP clients (tests/mpi/test_prometheus.sh): N connections that each send a
request a byte at a time, one byte every 50 ms, in a header that never ends.
A connection the server closes is opened again at once, so that N trickle all
the time, as an attacker's would.

    http_slow_clients.py HOST PORT N

Prints "trickling N" once every connection has sent its first byte, then
"closed K 408 J" each time the server closes one (K in all, J of them after
answering 408). Runs until killed.
"""
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: moed\r\nX-Slow: " + b"a" * 1_000_000


def opened():
    s = socket.create_connection((host, port), timeout=30)
    s.setblocking(False)
    return [s, 0, b""]  # socket, bytes sent, bytes received


conns = [opened() for _ in range(n)]
closed = answered_408 = 0
first = True
while True:
    for i, c in enumerate(conns):
        s, at, got = c
        ended = False
        try:
            data = s.recv(4096)
            if data:
                c[2] = got + data
            else:
                ended = True
        except BlockingIOError:
            pass
        except OSError:
            ended = True
        if not ended:
            try:
                s.send(REQUEST[at:at + 1])
                c[1] = at + 1
            except BlockingIOError:
                pass
            except OSError:
                ended = True
        if ended:
            closed += 1
            answered_408 += c[2].startswith(b"HTTP/1.1 408 ")
            s.close()
            conns[i] = opened()
            print(f"closed {closed} 408 {answered_408}", flush=True)
    if first:
        print(f"trickling {n}", flush=True)
        first = False
    time.sleep(0.05)
