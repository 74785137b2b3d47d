"""The processes of a multi-process run watch each other: one that ends without finishing its
command (killed, crashed, out of memory, stopped by an error of its own) stops the others at
once with one line naming it. Without this they wait in their next collective until JAX's
coordination service misses the lost one's heartbeats (JAX's default: 100 s) and aborts
them with a C++ check failure and every thread's stack.

Each process listens on a TCP port and publishes where (address, port, pid, host name) in
JAX's key-value store; each connects to every other one and waits on that connection. The
kernel closes a process's sockets however it ends (kill -9 too), and a process that finished
its command says `done` first, so the end of a connection without it is a lost peer. A host
that vanishes without closing its connections (power, network), or that this one cannot
reach (a firewall between hosts: one warning), is left to JAX's heartbeats. So is a run of more
than MAX_PROCESSES: every process holds a connection (and a thread) per peer, which on a pod of
hundreds of hosts would cost each of them hundreds of file descriptors.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

_DONE = b"done\n"
_KEY = "bert_jax/peers/{}"
_CONNECT_TIMEOUT_MS = 300_000  # as JAX's own initialization_timeout: peers start unevenly
_REACH_TIMEOUT_S = 10.0  # a published peer that does not accept in this time cannot be reached
MAX_PROCESSES = 64  # above it, 2 x (n - 1) sockets per process: left to JAX's heartbeats
_accepted: list[socket.socket] = []
_lock = threading.Lock()
_finished = threading.Event()  # this process finished its command
_watching: list[socket.socket] = []


def _address(coordinator: str | None) -> str:
    """This host's address as the coordinator's network sees it (the interface that reaches
    it; a UDP connect sends nothing)."""
    if not coordinator:
        return socket.gethostname()
    host = coordinator.rsplit(":", 1)[0].strip("[]")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()


def watch(command: str) -> None:
    """After jax.distributed.initialize: publish this process, connect to every other one (all
    at once, each within _REACH_TIMEOUT_S), and stop this one with one line on stderr when a
    peer's connection ends without `done`. Peers that cannot be reached: one warning."""
    import jax
    from jax._src import distributed  # its client (the key-value store): no public handle

    state = distributed.global_state
    me, n = jax.process_index(), jax.process_count()
    if state.client is None or not 2 <= n <= MAX_PROCESSES:
        return
    _finished.clear()  # this command's
    listener = socket.create_server(("", 0), backlog=max(n, 8))
    where = f"{_address(state.coordinator_address)}:{listener.getsockname()[1]}"
    state.client.key_value_set(_KEY.format(me), f"{where}|{os.getpid()}|{socket.gethostname()}")
    threading.Thread(target=_accept, args=(listener,), daemon=True).start()
    unreachable: list[str] = []

    def connect(other: int) -> None:
        address, pid, host = state.client.blocking_key_value_get(
            _KEY.format(other), _CONNECT_TIMEOUT_MS).split("|")
        ip, port = address.rsplit(":", 1)
        try:
            conn = socket.create_connection((ip, int(port)), timeout=_REACH_TIMEOUT_S)
        except OSError as e:  # a firewall between hosts: the run goes on, watched by JAX alone
            unreachable.append(f"{other} of {n} at {address} ({e.strerror or e})")
            return
        conn.settimeout(None)
        _watching.append(conn)
        threading.Thread(target=_wait, args=(conn, f"process {other} of {n} ({host}, pid {pid})",
                                              command), daemon=True, name=f"bert_jax-peer-{other}").start()

    connecting = [threading.Thread(target=connect, args=(other,), daemon=True)
                  for other in range(n) if other != me]
    for t in connecting:
        t.start()
    for t in connecting:
        t.join()
    if unreachable:
        print(f"warning: cannot watch process{'es' if len(unreachable) > 1 else ''} "
              f"{', '.join(sorted(unreachable))}: if {'one' if len(unreachable) > 1 else 'it'} is "
              "lost, this process waits for JAX's heartbeat timeout", file=sys.stderr)


def _accept(listener: socket.socket) -> None:
    """Keeps the peers' connections open (closed by the kernel when this process ends) for as
    long as the process lives; one accepted after this process finished is told so at once."""
    with listener:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener closed
            with _lock:
                _accepted.append(conn)
                if _finished.is_set():
                    _say_done(conn)


def _say_done(conn: socket.socket) -> None:
    try:
        conn.sendall(_DONE)
    except OSError:
        pass  # that peer is gone already


def _wait(conn: socket.socket, peer: str, command: str) -> None:
    try:
        said = conn.recv(len(_DONE), socket.MSG_WAITALL)  # all of it, or less at its end
    except OSError:
        said = b""
    if said == _DONE or _finished.is_set():
        return  # it finished its command, or this one did: its end is not a fault
    print(f"bert-jax {command}: error: {peer} ended before finishing (killed, crashed, or stopped "
          "by an error of its own: its log says which); this process stops too. Rerun the job on "
          "every host: a training run resumes from its last checkpoint", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # the main thread may be blocked in a collective that can never complete


def finished() -> None:
    """This process finished its command: tell the peers that its end is not a fault."""
    with _lock:
        _finished.set()
        for conn in _accepted:
            _say_done(conn)
