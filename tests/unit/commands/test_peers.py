"""commands.peers, the watch of a multi-process run, with JAX's key-value store faked: several
processes on this machine (each a small Python process running peers.py under a stand-in
`jax` module), killed, stopped or finishing; process 0 with 100 peers in this process; a peer's
connection fed by hand. The real `bert-jax train` processes: test_train.py's two-process tests
(slow)."""

import errno
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO

PEERS_PY = REPO / "bert_jax" / "commands" / "peers.py"
AFTER = ("; this process stops too. Rerun the job on every host: a training run resumes from its "
         "last checkpoint")
ENDED = " ended before finishing (killed, crashed, or stopped by an error of its own: its log says which)"
SILENT = " stopped answering (its host is down or cut off from this one's network)"

# One process of a run: peers.py loaded by path under a stand-in `jax` (process index and count
# from argv, the key-value store as files in a folder); prints `watching <its sockets>` once
# watch() returned, then obeys stdin: `finish` (peers.finished()), `settle` (waits for its
# watching thread to end); exits 0 when stdin closes.
PROCESS = r"""
import importlib.util, os, sys, threading, time, types

peers_py, store, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


class Store:
    def key_value_set(self, key, value):
        path = os.path.join(store, key.replace("/", "_"))
        with open(path + ".tmp", "w") as f:
            f.write(value)
        os.replace(path + ".tmp", path)

    def blocking_key_value_get(self, key, timeout_ms):
        path = os.path.join(store, key.replace("/", "_"))
        while not os.path.exists(path):
            time.sleep(0.01)
        with open(path) as f:
            return f.read()


jax = types.ModuleType("jax")
jax.process_index, jax.process_count = lambda: me, lambda: n
jax._src = types.ModuleType("jax._src")
jax._src.distributed = types.SimpleNamespace(global_state=types.SimpleNamespace(
    client=Store(), coordinator_address="127.0.0.1:1"))
sys.modules.update({"jax": jax, "jax._src": jax._src, "jax._src.distributed": jax._src.distributed})
spec = importlib.util.spec_from_file_location("peers", peers_py)
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)
for setting in sys.argv[5:]:
    name, value = setting.split("=")
    setattr(peers, name, int(value))
peers.watch("train")
sockets = 0
for fd in os.listdir("/proc/self/fd"):
    try:
        sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:
        pass
# One write of the whole line (processes share a pipe): print() writes the text and its end
# apart, which an unbuffered stdout (PYTHONUNBUFFERED) sends as two writes that interleave.
os.write(1, f"watching {sockets}\n".encode())
for line in sys.stdin:
    if line == "finish\n":
        peers.finished()
        print("finished", flush=True)
    elif line == "settle\n":
        for t in threading.enumerate():
            if t.name.startswith("bert_jax-peer"):
                t.join()
        print("settled", flush=True)
"""


def _line(proc) -> str:
    """The process's next line on stdout (an error after 120 s: a hang, not a slow machine)."""
    line = b""
    while not line.endswith(b"\n"):
        assert select.select([proc.stdout], [], [], 120)[0], f"no answer: {line!r}"
        char = proc.stdout.read(1)
        assert char, f"ended ({proc.wait()}): {proc.stderr.read().decode()[-2000:]}"
        line += char
    return line.decode().strip()


def _say(proc, word: str) -> str:
    proc.stdin.write(f"{word}\n".encode())
    proc.stdin.flush()
    return _line(proc)


def _start(tmp_path, n: int, *settings: str, prefix=()) -> list[subprocess.Popen]:
    """n processes of one run, each watching (their `watching` lines read)."""
    script = tmp_path / "process.py"
    script.write_text(PROCESS)
    (tmp_path / "store").mkdir()
    procs = [subprocess.Popen([*prefix, sys.executable, str(script), str(PEERS_PY), str(tmp_path / "store"),
                               str(i), str(n), *settings], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
             for i in range(n)]
    for i, proc in enumerate(procs):
        watching = _line(proc)
        if i:  # a star: each process other than 0 holds one connection (to process 0), no listener
            assert watching == "watching 1", (i, watching)
    return procs


def _ends(proc) -> tuple[int, list[str]]:
    """Its exit code and stderr lines, once it ended (it must end by itself)."""
    code = proc.wait(timeout=120)
    return code, proc.stderr.read().decode().splitlines()


def _pid_name(proc, i: int, n: int) -> str:
    return f"process {i} of {n} ({socket.gethostname()}, pid {proc.pid})"


@pytest.mark.parametrize("lost", [2, 0])
def test_a_killed_process_stops_every_other_with_one_line_naming_it(tmp_path, lost):
    """kill -9 of process 2 of 4: process 0 sees its connection end and tells 1 and 3, and all
    three stop naming process 2. kill -9 of process 0: the others stop naming process 0."""
    procs = _start(tmp_path, 4)
    procs[lost].send_signal(signal.SIGKILL)
    assert procs[lost].wait(timeout=120) == -signal.SIGKILL
    line = f"bert-jax train: error: {_pid_name(procs[lost], lost, 4)}{ENDED}{AFTER}"
    for i, proc in enumerate(procs):
        if i != lost:
            assert _ends(proc) == (1, [line]), i


@pytest.mark.parametrize("first", ["process 0", "the others"])
def test_processes_that_finish_stop_nobody(tmp_path, first):
    """Every process says `done` and ends, process 0 first or last: each one's end is no fault
    to the others (their watching threads end quietly: `settled`), all exit 0 and quiet."""
    procs = _start(tmp_path, 3)
    order = procs if first == "process 0" else [*procs[1:], procs[0]]
    for proc in order:
        assert _say(proc, "settle" if proc is order[-1] else "finish") == (
            "settled" if proc is order[-1] else "finished")
        if proc is order[-1]:
            assert _say(proc, "finish") == "finished"
        proc.stdin.close()
        assert _ends(proc) == (0, [])


def test_a_silent_host_is_found_by_keepalive(tmp_path):
    """Connections that stop carrying anything (as when a host loses power or its network: here
    loopback taken down in a network namespace of its own, with keepalive at 1 s, 1 s x 2):
    each process stops naming the other as stopped answering, within seconds."""
    if not shutil.which("unshare") or not shutil.which("ip") or subprocess.run(
            ["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True).returncode:
        pytest.skip("needs `unshare -rn` (user and network namespaces) and `ip`")
    fast = ("_KEEPALIVE_IDLE_S=1", "_KEEPALIVE_INTERVAL_S=1", "_KEEPALIVE_PROBES=2")
    # In the namespace: lo up, the two processes (their pids on stdout), lo down once both watch
    # (on `down`).
    launcher = tmp_path / "launcher.py"
    launcher.write_text(
        "import subprocess, sys\n"
        "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
        "procs = [subprocess.Popen([sys.executable, *sys.argv[1:4], str(i), *sys.argv[4:]],\n"
        "                          stdin=subprocess.PIPE) for i in (0, 1)]\n"
        "print(f'pids {procs[0].pid} {procs[1].pid}', flush=True)\n"
        "sys.stdin.readline()\n"
        "subprocess.run(['ip', 'link', 'set', 'lo', 'down'], check=True)\n"
        "sys.exit(max(abs(p.wait()) for p in procs))\n")
    script = tmp_path / "process.py"
    script.write_text(PROCESS)
    (tmp_path / "store").mkdir()
    proc = subprocess.Popen(
        ["unshare", "-rn", sys.executable, str(launcher), str(script), str(PEERS_PY),
         str(tmp_path / "store"), "2", *fast], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, bufsize=0)
    said = sorted(_line(proc) for _ in range(3))
    assert said[0].startswith("pids ") and [w.split()[0] for w in said[1:]] == ["watching"] * 2, said
    pids = said[0].split()[1:]
    proc.stdin.write(b"down\n")
    proc.stdin.close()
    code, lines = _ends(proc)
    assert code == 1 and sorted(lines) == [
        f"bert-jax train: error: process {i} of 2 ({socket.gethostname()}, pid {pids[i]}){SILENT}{AFTER}"
        for i in (0, 1)], lines


def _fake_run(monkeypatch, me: int, n: int, published: dict, lookup=None):
    """This process as process `me` of `n`, JAX's key-value store a dict (`lookup`: what a
    blocking get returns instead)."""
    import jax
    from jax._src import distributed

    from bert_jax.commands import peers

    class Store:
        def key_value_set(self, key, value):
            published[key] = value

        def blocking_key_value_get(self, key, timeout_ms):
            return lookup or published[key]

        def key_value_dir_get(self, folder):
            return [(k, v) for k, v in list(published.items()) if k.startswith(folder)]

    monkeypatch.setattr(distributed.global_state, "client", Store())
    monkeypatch.setattr(distributed.global_state, "coordinator_address", "127.0.0.1:1")
    monkeypatch.setattr(jax, "process_index", lambda: me)
    monkeypatch.setattr(jax, "process_count", lambda: n)
    monkeypatch.setattr(peers, "_finished", threading.Event())
    monkeypatch.setattr(peers, "_conns", [], raising=False)
    return peers


def _recv_line(conn: socket.socket) -> bytes:
    conn.settimeout(120)
    got = b""
    while not got.endswith(b"\n"):
        part = conn.recv(4096)
        assert part, got
        got += part
    return got


def test_process_0_watches_100_processes_with_one_thread(monkeypatch, capsys):
    """Process 0 of 101 (the others are sockets of this test that say hello as processes do):
    one thread watches them all; one closed without `done` is named to the 99 others, then
    process 0 stops with the same line."""
    published = {}
    peers = _fake_run(monkeypatch, 0, 101, published)
    stops = []
    stopped = threading.Event()
    before = set(threading.enumerate())

    def exit_(code):  # at the stop: which threads this watch runs
        stops.append((code, sorted(t.name for t in set(threading.enumerate()) - before)))
        stopped.set()

    monkeypatch.setattr(peers.os, "_exit", exit_)
    peers.watch("train")
    address, _, _ = published["bert_jax/peers/0"].split("|")
    ip, port = address.rsplit(":", 1)
    conns = []
    for k in range(1, 101):
        conns.append(socket.create_connection((ip, int(port))))
        conns[-1].sendall(f"hello {k}|{1000 + k}|host-{k}\n".encode())
    conns[36].close()  # process 37
    assert stopped.wait(120)
    lost = "process 37 of 101 (host-37, pid 1037)" + ENDED
    assert stops == [(1, ["bert_jax-peers"])]
    told = {_recv_line(conn) for k, conn in enumerate(conns, 1) if k != 37}
    assert told == {f"lost {lost}\n".encode()}
    assert capsys.readouterr().err.splitlines() == [f"bert-jax train: error: {lost}{AFTER}"]
    for conn in conns:
        conn.close()


def test_process_0_ignores_strangers_and_after_it_finished_still_tells_of_a_lost_one(monkeypatch,
                                                                                  capsys):
    """Process 0 of 3: connections that never say a hello of the run's processes (a port scan,
    process 0's own index, an index past the run) end without a fault; once process 0 finished
    its command, a process lost is still told to the others (their commands may go on), and
    process 0 does not stop."""
    published = {}
    peers = _fake_run(monkeypatch, 0, 3, published)
    exits = []
    monkeypatch.setattr(peers.os, "_exit", exits.append)
    peers.watch("embed")
    address, _, _ = published["bert_jax/peers/0"].split("|")
    ip, port = address.rsplit(":", 1)
    for said in (b"", b"GET / HTTP/1.0\n", b"hello 0|1|x\n", b"hello 3|1|x\n", b"hello one|1|x\n"):
        with socket.create_connection((ip, int(port))) as stranger:
            stranger.sendall(said)
    one, two = (socket.create_connection((ip, int(port))) for _ in range(2))
    one.sendall(b"hello 1|1001|host-1\n")
    two.sendall(b"hello 2|1002|host-2\n")
    peers.finished()
    assert _recv_line(one) == _recv_line(two) == b"done\n"
    two.close()  # lost after process 0 finished
    assert _recv_line(one) == f"lost process 2 of 3 (host-2, pid 1002){ENDED}\n".encode()
    one.close()
    for thread in threading.enumerate():
        if thread.name == "bert_jax-peers":
            thread.join(120)
    assert exits == [] and capsys.readouterr().err == ""


def test_watched_connections_probe_a_silent_peer(monkeypatch):
    """Process 1's connection to process 0 (and process 0's end of it) has TCP keepalive at 10 s
    idle, 5 s x 3 probes, and gives unacknowledged data as long (25 s)."""
    published = {}
    peers = _fake_run(monkeypatch, 1, 2, published)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        published["bert_jax/peers/0"] = f"127.0.0.1:{listener.getsockname()[1]}|7|host-0"
        peers.watch("train")
        theirs, _ = listener.accept()
        assert _recv_line(theirs).startswith(b"hello 1|")
        mine = peers._conns[0]
        tcp = socket.IPPROTO_TCP
        assert (mine.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
                mine.getsockopt(tcp, socket.TCP_KEEPIDLE), mine.getsockopt(tcp, socket.TCP_KEEPINTVL),
                mine.getsockopt(tcp, socket.TCP_KEEPCNT), mine.getsockopt(tcp, socket.TCP_USER_TIMEOUT)
                ) == (True, 10, 5, 3, 25_000)
        theirs.sendall(b"done\n")  # process 0 finished: the watching thread ends
        theirs.close()
        for thread in threading.enumerate():
            if thread.name == "bert_jax-peers":
                thread.join()


def test_what_process_0_says_stops_this_process(monkeypatch, capsys):
    """A process other than 0, on its connection to process 0: `done` (in pieces too) ends the
    watch quietly; `lost ...` stops it naming that process; the end of the connection without
    `done` names process 0, as an error that timed out says it stopped answering; after this
    process finished, nothing stops it."""
    from bert_jax.commands import peers

    exits = []
    monkeypatch.setattr(peers.os, "_exit", exits.append)
    monkeypatch.setattr(peers, "_finished", threading.Event())
    leader = "process 0 of 3 (host-0, pid 7)"

    class Pieces:  # what process 0 sent, as the reads get it
        def __init__(self, *parts):
            self.parts = list(parts)

        def recv(self, size):
            return self.parts.pop(0) if self.parts else b""

    peers._follow(Pieces(b"do", b"ne\n"), leader, "train")  # done, then its end: no fault
    # Process 0 finished, then tells of a process lost after it: this one stops naming it.
    peers._follow(Pieces(b"done\nlo", b"st process 1 of 3 (host-1, pid 8)", b" ended\n"), leader,
                  "train")
    for said in ([b"lost process 2 of 3 (host-2, pid 9) ended before finishing\n"], [b"hello\n"]):
        mine, theirs = socket.socketpair()
        for part in said:
            theirs.sendall(part)
        theirs.close()
        peers._follow(mine, leader, "train")
        mine.close()

    class Silent:
        def recv(self, size):
            raise OSError(errno.ETIMEDOUT, "Connection timed out")

    peers._follow(Silent(), leader, "train")
    peers._finished.set()
    for said in (b"lost process 2 of 3\n", b""):
        mine, theirs = socket.socketpair()
        theirs.sendall(said)
        theirs.close()
        peers._follow(mine, leader, "train")
        mine.close()
    assert exits == [1, 1, 1, 1]
    assert capsys.readouterr().err.splitlines() == [
        f"bert-jax train: error: process 1 of 3 (host-1, pid 8) ended{AFTER}",
        f"bert-jax train: error: process 2 of 3 (host-2, pid 9) ended before finishing{AFTER}",
        f"bert-jax train: error: {leader}{ENDED}{AFTER}",
        f"bert-jax train: error: {leader}{SILENT}{AFTER}"]


def test_process_0_out_of_reach_is_one_warning(monkeypatch, capsys):
    """Process 1 with process 0 published at a port nobody listens on (as behind a firewall):
    one warning, nothing watched, and the command goes on."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        closed = s.getsockname()[1]
    published = {}
    peers = _fake_run(monkeypatch, 1, 2, published, lookup=f"127.0.0.1:{closed}|4242|other-host")
    peers.watch("train")
    assert peers._conns == []
    assert published == {"bert_jax/peers/unreached/1":
                         f"{socket.gethostname()}|{os.getpid()}|127.0.0.1:{closed}|Connection refused"}
    assert capsys.readouterr().err.splitlines() == [
        f"warning: cannot watch process 0 of 2 at 127.0.0.1:{closed} (Connection refused): if it is "
        "lost, this process waits for JAX's heartbeat timeout"]


def test_process_0_names_a_process_that_cannot_reach_it(monkeypatch, capsys):
    """Process 0 of 4: process 1 connects, process 2 says in the key-value store that it cannot
    reach process 0 (as the test above writes it), process 3 has said nothing yet, and keys
    naming no other process of the run are there too (process 0's own, past the run, none):
    process 0 gives one warning naming process 2, once however often it looks; once process 3
    says so too, every process is accounted for and process 0 stops watching for more (its
    thread ends with the peers)."""
    published = {}
    peers = _fake_run(monkeypatch, 0, 4, published)
    monkeypatch.setattr(peers, "_POLL_S", 0.05)
    looks = []
    monkeypatch.setattr(peers._Leader, "_find_unreached",
                        lambda self, real=peers._Leader._find_unreached: (looks.append(1), real(self)))
    peers.watch("train")
    address, _, _ = published["bert_jax/peers/0"].split("|")
    ip, port = address.rsplit(":", 1)
    one = socket.create_connection((ip, int(port)))
    one.sendall(b"hello 1|1001|host-1\n")
    for stray in ("0", "4", "x"):  # process 0 itself, past the run, no index
        published[f"bert_jax/peers/unreached/{stray}"] = f"host-{stray}|1|{address}|No route to host"
    published["bert_jax/peers/unreached/2"] = f"host-2|1002|{address}|No route to host"

    def warning(k):
        return (f"warning: process {k} of 4 (host-{k}, pid 100{k}) cannot reach process 0 at {address} "
                "(No route to host): if it is lost, this process waits for JAX's heartbeat timeout")
    err = ""
    for _ in range(1200):  # (the thread looks every 0.05 s; a loaded machine may take longer)
        err += capsys.readouterr().err
        if warning(2) in err:
            break
        time.sleep(0.05)
    seen = len(looks)
    while len(looks) < seen + 3:  # three more looks: none may warn again
        time.sleep(0.05)
    assert (err + capsys.readouterr().err).splitlines() == [warning(2)]
    published["bert_jax/peers/unreached/3"] = f"host-3|1003|{address}|No route to host"
    for _ in range(1200):
        err = capsys.readouterr().err
        if err:
            break
        time.sleep(0.05)
    assert err.splitlines() == [warning(3)]
    peers.finished()
    assert _recv_line(one) == b"done\n"
    one.close()
    threads = [t for t in threading.enumerate() if t.name == "bert_jax-peers"]
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)  # (its listener closed: nothing left to watch)


def test_process_0_warns_when_its_file_limit_cannot_hold_its_peers(monkeypatch, capsys):
    """A run of 1,001 processes where process 0 may open 500 files (hard limit too): one warning
    with the limit to set; under a hard limit that allows it, the soft limit is raised."""
    import resource

    from bert_jax.commands import peers

    limits = {"hard": 500}
    set_to = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (500, limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: set_to.append(value))
    peers._check_files(1001)
    assert capsys.readouterr().err.splitlines() == [
        "warning: process 0 may open 500 files and watching the other 1000 processes takes one each: "
        "raise its limit (ulimit -n) to 1256 or more; a process it cannot accept is left to JAX's "
        "heartbeat timeout"]
    limits["hard"] = 4096
    peers._check_files(1001)
    assert set_to == [(1256, 4096)] and capsys.readouterr().err == ""
