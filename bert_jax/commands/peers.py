"""The processes of a multi-process run watch each other: one that ends without finishing its
command (killed, crashed, out of memory, stopped by an error of its own), or whose host stops
answering (power, network), stops the others within seconds with one line naming it. Without
this they wait in their next collective until JAX's coordination service misses the lost
one's heartbeats (JAX's default: 100 s) and aborts them with a C++ check failure and every
thread's stack.

A star, so that a pod of hundreds of hosts costs each process one connection and one thread:
process 0 listens on a TCP port and publishes where (address, port, pid, host name) in JAX's
key-value store; every other process connects to it and says which process it is. Process 0
watches all of those connections from one thread (selectors); each other process watches its
connection to process 0. The kernel closes a process's sockets however it ends (kill -9 too),
and a process that finished its command says `done` first, so the end of a connection without
it is a lost peer; a host that vanishes without closing them is found by TCP keepalive (about
25 s of silence, _KEEPALIVE_*). Process 0, on losing a peer, first tells every other one which
(`lost ...`), so that all of them stop naming the lost process; when process 0 itself is lost,
the others see their connection to it end. A process that cannot reach process 0 (a firewall
between hosts) gives one warning, says so in the key-value store, where process 0 (which
looks there every _POLL_S until every process connected or said so) finds it and gives one
warning naming it; such a process is left to JAX's heartbeats.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import sys
import threading
import time

_DONE = b"done\n"  # either way: the sender finished its command, its end is not a fault
_HELLO = b"hello "  # + b"<index>|<pid>|<host>\n": a process's first line to process 0
_LOST = b"lost "  # + what happened to which process + b"\n": process 0 to the others
_KEY = "bert_jax/peers/{}"
_UNREACHED = "bert_jax/peers/unreached/"  # + index: b"<host>|<pid>|<address>|<why>" of a process
_POLL_S = 5.0  # process 0 looks for such processes this often while some have not connected
_THREAD = "bert_jax-peers"  # the one watching thread of each process
_CONNECT_TIMEOUT_MS = 300_000  # as JAX's own initialization_timeout: peers start unevenly
_REACH_TIMEOUT_S = 10.0  # process 0 published but not accepting in this time: cannot be reached
# TCP keepalive on every watched connection: after _KEEPALIVE_IDLE_S without traffic the kernel
# probes the peer every _KEEPALIVE_INTERVAL_S and ends the connection (ETIMEDOUT) after
# _KEEPALIVE_PROBES unanswered probes, so a silent host is found within 10 + 5 x 3 = 25 s
# (JAX's heartbeats: 100 s); data sent and not acknowledged is given as long (TCP_USER_TIMEOUT).
_KEEPALIVE_IDLE_S = 10
_KEEPALIVE_INTERVAL_S = 5
_KEEPALIVE_PROBES = 3
_SPARE_FILES = 256  # process 0's own files (checkpoints, logs, JAX's) beside one per peer
_lock = threading.Lock()
_finished = threading.Event()  # this process finished its command
_conns: list[socket.socket] = []  # the connections to tell `done` when this process finishes


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
    """After jax.distributed.initialize: process 0 publishes where it listens and watches every
    other process from one thread; each other process connects to it (within
    _REACH_TIMEOUT_S) and watches that connection. A peer lost stops this process with one line
    on stderr naming it. Process 0 out of reach: one warning."""
    import jax
    from jax._src import distributed  # its client (the key-value store): no public handle

    state = distributed.global_state
    me, n = jax.process_index(), jax.process_count()
    if state.client is None or n < 2:
        return
    _finished.clear()  # this command's
    with _lock:
        _conns.clear()
    if me == 0:
        _check_files(n)
        listener = socket.create_server(("", 0), backlog=n)
        where = f"{_address(state.coordinator_address)}:{listener.getsockname()[1]}"
        state.client.key_value_set(_KEY.format(0), f"{where}|{os.getpid()}|{socket.gethostname()}")
        threading.Thread(target=_Leader(command, n, listener, state.client).run, daemon=True,
                         name=_THREAD).start()
        return
    address, pid, host = state.client.blocking_key_value_get(
        _KEY.format(0), _CONNECT_TIMEOUT_MS).split("|")
    ip, port = address.rsplit(":", 1)
    try:
        conn = socket.create_connection((ip, int(port)), timeout=_REACH_TIMEOUT_S)
        conn.settimeout(None)
        _keep_alive(conn)
        conn.sendall(_HELLO + f"{me}|{os.getpid()}|{socket.gethostname()}\n".encode())
    except OSError as e:  # a firewall between hosts: the run goes on, watched by JAX alone
        why = e.strerror or str(e)
        print(f"warning: cannot watch process 0 of {n} at {address} ({why}): if "
              f"{'it' if n == 2 else 'any process'} is lost, this process waits for JAX's "
              "heartbeat timeout", file=sys.stderr)
        try:  # for process 0's own warning
            state.client.key_value_set(_UNREACHED + str(me),
                                       f"{socket.gethostname()}|{os.getpid()}|{address}|{why}")
        except Exception:  # noqa: BLE001 (the store is JAX's; a failure here changes nothing)
            pass
        return
    with _lock:
        _conns.append(conn)
    threading.Thread(target=_follow, args=(conn, f"process 0 of {n} ({host}, pid {pid})", command),
                     daemon=True, name=_THREAD).start()


def _check_files(n: int) -> None:
    """Process 0 holds a connection (a file descriptor) per peer: raise its soft limit to fit
    them, or warn in one line where the hard limit does not allow it."""
    try:
        import resource
    except ImportError:  # no such limit (Windows)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n - 1 + _SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (ValueError, OSError):
            pass
    print(f"warning: process 0 may open {soft} files and watching the other {n - 1} processes takes "
          f"one each: raise its limit (ulimit -n) to {need} or more; a process it cannot accept is "
          "left to JAX's heartbeat timeout", file=sys.stderr)


def _keep_alive(conn: socket.socket) -> None:
    """Keepalive probes on a watched connection, so that a silent peer ends it (ETIMEDOUT)."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    silent_ms = 1000 * (_KEEPALIVE_IDLE_S + _KEEPALIVE_INTERVAL_S * _KEEPALIVE_PROBES)
    # (macOS names the idle time TCP_KEEPALIVE; a platform without an option keeps its default)
    idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))
    for option, value in ((idle, _KEEPALIVE_IDLE_S),
                          (getattr(socket, "TCP_KEEPINTVL", None), _KEEPALIVE_INTERVAL_S),
                          (getattr(socket, "TCP_KEEPCNT", None), _KEEPALIVE_PROBES),
                          (getattr(socket, "TCP_USER_TIMEOUT", None), silent_ms)):
        if option is not None:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


def _what(peer: str, error: OSError | None) -> str:
    """What happened to a peer whose connection ended (error: how, if not at its end)."""
    if error is not None and error.errno in (errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{peer} stopped answering (its host is down or cut off from this one's network)"
    return (f"{peer} ended before finishing (killed, crashed, or stopped by an error of its own: "
            "its log says which)")


def _stop(command: str, what: str) -> None:
    print(f"bert-jax {command}: error: {what}; this process stops too. Rerun the job on every "
          "host: a training run resumes from its last checkpoint", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # the main thread may be blocked in a collective that can never complete


def _send(conn: socket.socket, line: bytes) -> None:
    try:
        conn.sendall(line)
    except OSError:
        pass  # that peer is gone already


def _receive(conn: socket.socket) -> tuple[bytes, OSError | None]:
    """What the peer sent (b"" at the connection's end, with the error that ended it if any)."""
    try:
        return conn.recv(4096), None
    except OSError as e:
        return b"", e


def _follow(conn: socket.socket, leader: str, command: str) -> None:
    """A process other than 0: waits on its connection to process 0 (`leader`) until it ends
    or names a lost process. Process 0 that finished its command says `done` and goes on
    telling the others of a lost one, so its end after `done` is not a fault."""
    pending, leader_done = b"", False
    while True:
        data, error = _receive(conn)
        if not data:
            if not (leader_done or _finished.is_set()):  # after this one finished: no fault
                _stop(command, _what(leader, error))
            return
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if line == _DONE.strip():
                leader_done = True  # process 0 finished its command
            elif line.startswith(_LOST):
                if not _finished.is_set():
                    _stop(command, line[len(_LOST):].decode(errors="replace"))
                return


class _Peer:
    """Process 0's view of one connection: the process (once it said hello), whether it is done."""

    def __init__(self, address):
        self.name = f"a process at {address[0]}:{address[1]} (before it said which)"
        self.pending = b""
        self.done = False
        self.named = False  # said a hello of one of the run's processes: else not watched


class _Leader:
    """Process 0's one thread: accepts the others' connections and watches them all, until
    every one has connected and ended, or one is lost (told to the others, then the stop)."""

    def __init__(self, command: str, n: int, listener: socket.socket, store) -> None:
        self.command, self.n, self.listener, self.store = command, n, listener, store
        self.selector = selectors.DefaultSelector()
        self.peers: dict[socket.socket, _Peer] = {}
        self.connected: set[str] = set()  # the indices of the processes that said hello
        self.unreached: set[str] = set()  # those of the processes that said they cannot
        self.polled = -_POLL_S  # when the key-value store was last looked at (time.monotonic)

    def run(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            while self.listener is not None or self.peers:
                if self.listener is not None and time.monotonic() >= self.polled + _POLL_S:
                    self._find_unreached()
                    self.polled = time.monotonic()
                for key, _ in self.selector.select(_POLL_S if self.listener is not None else None):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif (lost := self._read(key.fileobj)) is not None:
                        if self._lose(lost):
                            return
        finally:  # (reached only where os._exit is not the real one: tests)
            for conn in [*self.peers, *([self.listener] if self.listener else [])]:
                conn.close()
            self.selector.close()

    def _accept(self) -> None:
        """Every connection waiting to be accepted (each told `done` if this process finished)."""
        while self.listener is not None:
            try:
                conn, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors (see _check_files): accept no more
                print(f"warning: process 0 cannot watch more processes ({e.strerror or e}); one "
                      "lost is left to JAX's heartbeat timeout", file=sys.stderr)
                self._close_listener()
                return
            conn.setblocking(False)
            _keep_alive(conn)
            self.peers[conn] = _Peer(address)
            self.selector.register(conn, selectors.EVENT_READ)
            with _lock:
                _conns.append(conn)
                if _finished.is_set():
                    _send(conn, _DONE)

    def _find_unreached(self) -> None:
        """One warning per process that said (in the key-value store) it cannot reach this one."""
        try:
            said = self.store.key_value_dir_get(_UNREACHED)
        except Exception:  # noqa: BLE001 (JAX's store: left to its own heartbeats)
            return
        for key, value in said:
            index = key.rsplit("/", 1)[-1]
            if (not index.isdigit() or not 1 <= int(index) < self.n or value.count("|") < 3
                    or index in self.unreached | self.connected):
                continue
            self.unreached.add(index)
            host, pid, address, why = value.split("|", 3)
            print(f"warning: process {index} of {self.n} ({host}, pid {pid}) cannot reach process "
                  f"0 at {address} ({why}): if it is lost, this process waits for JAX's heartbeat "
                  "timeout", file=sys.stderr, flush=True)
        self._close_if_all_known()

    def _close_if_all_known(self) -> None:
        """Every other process connected or said it cannot: nothing more to accept."""
        if self.listener is not None and len(self.connected | self.unreached) == self.n - 1:
            self._close_listener()

    def _close_listener(self) -> None:
        self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None

    def _read(self, conn: socket.socket) -> str | None:
        """Reads what a peer sent; at its connection's end, what was lost (None if no fault)."""
        peer = self.peers[conn]
        data, error = _receive(conn)
        if isinstance(error, BlockingIOError | InterruptedError):
            return None
        if data:
            *lines, peer.pending = (peer.pending + data).split(b"\n")
            for line in lines:
                if not peer.named and (hello := _hello(line, self.n)):
                    peer.name, peer.named = hello, True
                    self.connected.add(line[len(_HELLO):].split(b"|")[0].decode())
                    self._close_if_all_known()
                elif line == _DONE.strip():
                    peer.done = True
            return None
        self.selector.unregister(conn)
        del self.peers[conn]
        with _lock:
            _conns.remove(conn)
        conn.close()
        # (a connection that never said a run's hello, a port scan say, is no process of it)
        return None if peer.done or not peer.named else _what(peer.name, error)

    def _lose(self, what: str) -> bool:
        """Tells every other process (those still waiting to be accepted too) which one was lost,
        then stops this one; once this one finished its command it goes on (False)."""
        self._accept()
        with _lock:
            for conn, peer in self.peers.items():
                if not peer.done:
                    _send(conn, _LOST + what.encode() + b"\n")
            if _finished.is_set():
                return False
        _stop(self.command, what)
        return True


def _hello(line: bytes, n: int) -> str | None:
    """The process a `hello <index>|<pid>|<host>` line names, if it is one of the run's others."""
    if not line.startswith(_HELLO) or line.count(b"|") != 2:
        return None
    index, pid, host = line[len(_HELLO):].decode(errors="replace").split("|")
    if not (index.isdigit() and 1 <= int(index) < n):
        return None
    return f"process {index} of {n} ({host}, pid {pid})"


def finished() -> None:
    """This process finished its command: tell the peers that its end is not a fault."""
    with _lock:
        _finished.set()
        for conn in _conns:
            _send(conn, _DONE)
