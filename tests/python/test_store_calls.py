"""The elastic runtime's store calls that hang on a cut network: at the end
of a run their connections are shut down, so that their threads end before
the interpreter finalizes (a thread returning into Python then is unwound
through C++ frames that forbid it, and the process aborts)."""
import socket
import threading
import time

from stoker.elastic._store_calls import _Caller, _shutdown_connections_to


def test_a_blocked_call_ends_when_its_connections_are_shut_down():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()

    def connect():
        return socket.create_connection(("127.0.0.1", port))

    caller = _Caller(connect, patience=0.2)
    try:
        caller.run(lambda s: s.recv(1))  # the server never answers: left behind
    except TimeoutError:
        pass
    left = [t for t in caller._left if t.is_alive()]
    assert len(left) == 1
    # A connection elsewhere is not touched.
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    bystander = socket.create_connection(other.getsockname())
    t = time.monotonic()
    caller.end("127.0.0.1:%d" % port, wait=5.0)
    assert not left[0].is_alive() and time.monotonic() - t < 2.0
    bystander.send(b"x")  # still open
    for s in (server, other, bystander):
        s.close()


def test_an_unresolvable_endpoint_is_ignored():
    _shutdown_connections_to("no-such-host.invalid:1")
    _shutdown_connections_to("not an endpoint")
