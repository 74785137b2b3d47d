"""Training with a gs:// workdir, end to end, against a GCS emulator served from this process
(localhost only; no network, no credentials): checkpoints, metrics.jsonl, TensorBoard events and
summary.json land in the bucket; a run that crashed while saving resumes from its last complete
gs:// checkpoint with identical losses; `bert-jax eval` and `bert-jax plot` read the bucket and
write there. Every other path on gs:// too (in-process): globs of text files, a tokenizer,
`vocab --input/--out`, `prepare --out` and array_record shards read from the bucket, the
`features`/`translate` inputs and outputs, fine-tuning task files (data.data_dir, --split) and
their prediction files, `init_from` and `average --out` on gs://."""

import collections
import errno
import functools
import gzip
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http import HTTPStatus, server
from urllib.parse import parse_qs, unquote, urlparse

import jax
import numpy as np
import pytest
from helpers import REPO, compile_new_program, jax_cache_of_the_test, xla_flags
from test_train import CONFIG, SMALL

_INSTALL = "pip install -e '.[test]'"
gcsfs_core = pytest.importorskip("gcsfs.core", reason=f"gcsfs is not installed ({_INSTALL})")
pytest.importorskip("gcp_storage_emulator.server",
                    reason=f"gcp-storage-emulator is not installed ({_INSTALL})")

BUCKET = "bucket"
_OBJECT = re.compile(r"(?:/download)?/storage/v1/b/(?P<bucket>[-.\w]+)/o/(?P<name>[^/]+)")


def _emulator_handler():
    """The emulator's request handler plus what tensorstore (Orbax's array writer) needs of GCS
    reads and the emulator lacks: the object's generation in an `x-goog-generation` header, and
    the ifGenerationNotMatch / ifGenerationMatch conditions (304 / 412). Without them an OCDBT
    manifest update fails with "Malformed StorageGeneration"."""
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.server import RequestHandler

    class Handler(RequestHandler):
        generation = None

        def do_GET(self):
            self.generation = None
            url = urlparse(self.path)
            match = _OBJECT.fullmatch(url.path)
            if match:
                try:
                    obj = self.storage.get_file_obj(match["bucket"], unquote(match["name"]))
                    self.generation = obj["generation"]
                except NotFound:
                    pass
            if self.generation is not None:
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if query.get("ifGenerationNotMatch") == self.generation:
                    return self._empty(HTTPStatus.NOT_MODIFIED)
                if query.get("ifGenerationMatch", self.generation) != self.generation:
                    return self._empty(HTTPStatus.PRECONDITION_FAILED)
            super().do_GET()

        def _empty(self, status):
            self.generation = None
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def end_headers(self):
            if self.generation is not None:
                self.send_header("x-goog-generation", self.generation)
                self.generation = None
            super().end_headers()

    return Handler


class Faults:
    """Transient faults a real bucket gives now and then, injected deterministically: every
    `every`-th request answered 503 (Service Unavailable, which GCS returns under load and
    asks clients to retry) and every `slow`-th delayed `delay` seconds; counted. And a store
    that keeps failing: while `kind` is set, every request it picks (a predicate on the
    request handler) is answered 503, counted by method and path in `refused`."""

    def __init__(self, every: int = 0, slow: int = 0, delay: float = 0.0):
        self.every, self.slow, self.delay = every, slow, delay
        self.requests = self.failed = self.delayed = 0
        self.kind, self.code = None, 503  # (real GCS also answers 429 and 408: see below)
        self.refused: collections.Counter = collections.Counter()
        self.lock = threading.Lock()

    def fault(self, request=None) -> bool:
        """Whether this request fails (after its delay, if it is a slow one)."""
        with self.lock:
            self.requests += 1
            n = self.requests
            if self.kind is not None and request is not None and self.kind(request):
                # (tensorstore sends a new cache-busting tensorstore=<nonce> with each try)
                path = re.sub(r"[?&]tensorstore=\w+", "", request.path)
                self.refused[f"{request.command} {path}"] += 1
                return True
            fail = bool(self.every) and n % self.every == 0
            slow = bool(self.slow) and n % self.slow == 0
            self.failed += fail
            self.delayed += slow
        if slow:
            time.sleep(self.delay)
        return fail


def _faulty(handler, faults: Faults):
    """The emulator's handler, answering the requests `faults` picks with a 503."""

    class Faulty(handler):
        def handle_one_request(self):
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            if faults.fault(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)  # the body of an upload, dropped
                body = json.dumps({"error": {"code": faults.code, "message": (
                    f"{HTTPStatus(faults.code).phrase} (injected)")}}).encode()
                self.send_response(faults.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            method = getattr(self, f"do_{self.command}")
            method()
            self.wfile.flush()

    return Faulty


def _serve(faults: Faults | None = None):
    """(server, url, environment for `bert-jax` subprocesses) of an emulator with a bucket."""
    from gcp_storage_emulator.handlers import buckets
    from gcp_storage_emulator.storage import Storage

    storage = Storage(use_memory_fs=True)
    buckets.create_bucket(BUCKET, storage)
    handler = _emulator_handler() if faults is None else _faulty(_emulator_handler(), faults)
    # One request at a time: the emulator's storage is not thread-safe.
    httpd = server.HTTPServer(("localhost", 0), functools.partial(handler, storage))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://localhost:{httpd.server_address[1]}"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               STORAGE_EMULATOR_HOST=url,  # gcsfs (etils epath: config, metrics, step listing)
               FSSPEC_GS_TOKEN="anon",  # gcsfs: no credential lookup
               # gcsfs's default file system asks the Storage Control gRPC API for each bucket's
               # layout before mkdir/rm/mv; the emulator has no such API (60 s timeouts each).
               GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
               TENSORSTORE_GCS_HTTP_URL=url,  # tensorstore (Orbax arrays)
               CLOUD_STORAGE_EMULATOR_ENDPOINT=url,  # google-cloud-cpp (array_record's reader)
               GOOGLE_AUTH_TOKEN_FOR_TESTING="test")  # tensorstore: no credential lookup
    return httpd, thread, url, env


@pytest.fixture(scope="module")
def gcs():
    """(gcsfs filesystem on the emulator, environment for `bert-jax` subprocesses using it)."""
    httpd, thread, url, env = _serve()
    fs = gcsfs_core.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True)
    yield fs, env
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _forget_gcs_clients() -> None:
    """Drops the cached gcsfs clients (etils epath keeps one for the process), so the next
    gs:// access builds one from the current environment."""
    import fsspec
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()
    gcsfs_core.GCSFileSystem.clear_instance_cache()
    fsspec.get_filesystem_class("gs").clear_instance_cache()  # paths' subclass: a cache of its own


# The variables that point each GCS client at the emulator (_serve's environment).
_GCS_ENV = ("STORAGE_EMULATOR_HOST", "FSSPEC_GS_TOKEN", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
            "TENSORSTORE_GCS_HTTP_URL", "CLOUD_STORAGE_EMULATOR_ENDPOINT", "GOOGLE_AUTH_TOKEN_FOR_TESTING")


@pytest.fixture(scope="module")
def gcs_here(gcs):
    """The emulator for this process (bert_jax called in-process: the `cli` fixture); the
    environment and gcsfs clients are restored afterwards."""
    fs, env = gcs
    with pytest.MonkeyPatch.context() as mp:
        for key in _GCS_ENV:
            mp.setenv(key, env[key])
        _forget_gcs_clients()
        yield fs
    _forget_gcs_clients()


def bert_jax(env, *args) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "bert_jax", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"bert-jax {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def listing(fs, path) -> list[str]:
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path))


def losses(fs, path) -> dict[int, float]:
    rows = [json.loads(line) for line in fs.cat(f"{path}/metrics.jsonl").decode().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert len(steps) == len(set(steps)), f"repeated steps in metrics.jsonl: {steps}"
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.slow
def test_train_resume_and_eval_in_a_gs_workdir(gcs, gcs_here, cli):
    """Checkpoints, metrics, goodput and (without JAX_COMPILATION_CACHE_DIR) the compiled
    programs in the bucket; a resume, an eval and a plot from there. (Train and resume are
    processes of their own, using the bucket's compilation cache; eval and plot in-process.)"""
    fs, env = gcs
    env = {k: v for k, v in env.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    root, workdir = f"{BUCKET}/run", f"gs://{BUCKET}/run"
    train = ["train", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL,
             "--config.train.steps=8", "--config.train.checkpoint_every=4"]
    bert_jax(env, *train)
    compiled = listing(fs, f"{root}/compilation_cache")
    assert any(e.startswith("jit_wrapped-") for e in compiled), compiled  # train and eval steps
    attempt = json.loads(fs.cat(f"{root}/goodput.json"))["attempts"][-1]
    assert attempt["step"] == 8 and 0 < attempt["train_s"] < attempt["wall_s"]
    files = listing(fs, root)
    assert {"checkpoints", "metrics.jsonl", "summary.json"} <= set(files), files
    assert any(f.startswith("events.out.tfevents") for f in files), files
    assert listing(fs, f"{root}/checkpoints") == ["4", "8"]
    for step in (4, 8):  # committed, with every item; arrays in tensorstore's OCDBT format
        items = listing(fs, f"{root}/checkpoints/{step}")
        assert {"commit_success.txt", "params", "opt_state", "data", "config"} <= set(items), items
        assert "manifest.ocdbt" in listing(fs, f"{root}/checkpoints/{step}/params")
        # with the checksums of its files, written before the commit marker
        checksums = json.loads(fs.cat(f"{root}/checkpoints/{step}/checksums.json"))["files"]
        assert {"params/manifest.ocdbt", "config/metadata"} <= set(checksums), sorted(checksums)
    stored = json.loads(fs.cat(f"{root}/checkpoints/8/config/metadata"))
    assert stored["train"]["steps"] == 8 and stored["model"]["vocab_size"] == 256
    reference = losses(fs, root)
    assert sorted(reference) == list(range(1, 9))
    assert json.loads(fs.cat(f"{root}/summary.json"))["step"] == 8
    assert not (REPO / "gs:").exists()  # nothing went to a local folder named like the URL

    # A crash while checkpoint 8 was being written: its metrics lines reached the bucket, its
    # commit marker did not. The rerun resumes from 4, redoes 5-8 and replaces their lines.
    fs.rm(f"{root}/checkpoints/8/commit_success.txt")
    resumed = bert_jax(env, *train)
    assert f"resumed from {workdir}/checkpoints/4" in resumed.stdout, resumed.stdout[-2000:]
    assert "unverified" not in resumed.stdout  # its checksums were read and matched
    assert losses(fs, root) == reference  # bitwise, and each step once
    # Its programs came from the bucket's cache: only the restore's small ones are new.
    recompiled = set(listing(fs, f"{root}/compilation_cache")) - set(compiled)
    assert not [name for name in recompiled if name.startswith("jit_wrapped-")], sorted(recompiled)
    attempts = json.loads(fs.cat(f"{root}/goodput.json"))["attempts"]
    assert [(a["start_step"], a["step"], a["redone_steps"]) for a in attempts] == [(0, 8, 0), (4, 8, 4)]
    assert "commit_success.txt" in listing(fs, f"{root}/checkpoints/8")
    summary = json.loads(fs.cat(f"{root}/summary.json"))
    assert summary["step"] == 8 and not summary["preempted"]

    code, out, err = cli(["eval", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL, "--step=all"])
    assert code == 0, err[-3000:]
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["step"] for r in results] == [4, 8]
    # The same parameters and validation batches as the run's own final evaluation.
    assert results[-1]["eval/loss"] == pytest.approx(summary["eval"]["eval/loss"], rel=1e-6)
    assert listing(fs, f"{root}/eval") == ["step_4.json", "step_8.json"]
    assert json.loads(fs.cat(f"{root}/eval/step_8.json")) == results[-1]

    # The run's curves, drawn from the bucket into it.
    code, out, err = cli(["plot", f"--workdir={workdir}"])
    assert code == 0, err[-3000:]
    plotted = json.loads(out.splitlines()[-1])
    assert plotted["figure"] == f"{workdir}/plots/metrics.png"
    assert listing(fs, f"{root}/plots") == ["metrics.csv", "metrics.png"]
    csv_rows = fs.cat(f"{root}/plots/metrics.csv").decode().splitlines()
    assert sum(",loss," in r for r in csv_rows) == 8


@pytest.mark.slow
def test_a_run_survives_transient_storage_faults_and_resumes_exactly():
    """Every 23rd request to the bucket answered 503 and every 10th slowed by 0.1 s, from the
    first request to the last: training, its checkpoints (gcsfs and tensorstore, each with its
    own retries) and a resume after a crash while saving all go through, with the losses of
    the uninterrupted run. (A run makes ~540 requests: ~23 faults each.) The retries wait
    milliseconds ($BERT_JAX_GCS_RETRY, the policy's default tries): each fault is still
    retried by both libraries, without the policy's 1 s back-off (~45 s of sleeping)."""
    faults = Faults(every=23, slow=10, delay=0.1)
    httpd, thread, url, env = _serve(faults)
    env["BERT_JAX_GCS_RETRY"] = "first_wait_s=0.01,max_wait_s=0.02"
    env["XLA_FLAGS"] = xla_flags(8, few_steps=True)  # its runs are compared with each other
    fs = gcsfs_core.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True)
    try:
        root, workdir = f"{BUCKET}/flaky", f"gs://{BUCKET}/flaky"
        train = ["train", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL,
                 "--config.train.steps=4", "--config.train.checkpoint_every=2",
                 "--config.schedule.warmup_steps=1"]
        first = bert_jax(env, *train)
        assert faults.failed >= 10 and faults.delayed >= 10, vars(faults)
        reference = losses(fs, root)
        assert sorted(reference) == list(range(1, 5))
        failed = faults.failed
        fs.rm(f"{root}/checkpoints/4/commit_success.txt")  # as if killed while saving step 4
        resumed = bert_jax(env, *train)
        assert f"resumed from {workdir}/checkpoints/2" in resumed.stdout, resumed.stdout[-2000:]
        assert faults.failed > failed + 5, vars(faults)
        assert losses(fs, root) == reference  # bitwise, each step once
        assert "Traceback" not in first.stderr + resumed.stderr
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def failing_gcs(monkeypatch):
    """An emulator behind the fault injector, for this process (the `cli` fixture): (gcsfs on it,
    its Faults, idle until the test sets `kind`)."""
    faults = Faults()
    httpd, thread, url, env = _serve(faults)
    httpd.handle_error = lambda request, address: None  # a client gone mid-answer: no traceback
    for key in _GCS_ENV:
        monkeypatch.setenv(key, env[key])
    _forget_gcs_clients()
    try:
        yield gcsfs_core.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True), faults
    finally:
        _forget_gcs_clients()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _tensorstore(method: str, step: int):
    """The requests of tensorstore (Orbax's array writer and reader) with HTTP `method` into a
    checkpoint `step` (POST: its uploads, GET: its reads)."""
    def kind(request) -> bool:
        return (request.command == method and f"/checkpoints/{step}/" in unquote(request.path)
                and request.headers.get("User-Agent", "").startswith("tensorstore/"))
    return kind


_ADVICE = ("check GCS's status (status.cloud.google.com) and the bucket's permissions and quota, then "
           "rerun (a training run resumes from its last complete checkpoint; $BERT_JAX_GCS_RETRY "
           "retries longer)")
_FAST_RETRIES = "tries=3,first_wait_s=0.01,max_wait_s=0.02"  # the policy's schedule, in ms


# Real GCS answers 429 (Too Many Requests) where the emulator never does: more than about one
# write a second to one object (metrics.jsonl, goodput.json), or a bucket's request rate rising
# faster than GCS scales it; and 408 (Request Timeout) to a slow upload. GCS documents 408, 429
# and 5xx as transient (retry with backoff): both libraries retry them by the same policy.
RETRIED = pytest.mark.parametrize("code", [503, 429, 408])


@RETRIED
def test_gcsfs_requests_that_keep_failing_stop_in_one_line_after_the_policys_tries(failing_gcs,
                                                                                   monkeypatch, code,
                                                                                   tmp_path):
    """Every read of one object answered `code` (gcsfs: etils epath, paths.open, globs, fsspec's
    get): each request is tried as often as $BERT_JAX_GCS_RETRY says (gcsfs alone: 6 times,
    whatever it says; a download by get 6 x 6 times), then one line names the operation and
    the gs:// path; other objects read on."""
    from bert_jax import paths

    fs, faults = failing_gcs
    faults.code = code
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    fs.pipe(f"{BUCKET}/cfg/good.json", b'{"a": 1}')
    fs.pipe(f"{BUCKET}/cfg/bad.json", b'{"a": 2}')
    faults.kind = lambda request: request.command == "GET" and "bad.json" in unquote(request.path)
    with pytest.raises(paths.StorageFailing) as failed:
        paths.read_json(f"gs://{BUCKET}/cfg/bad.json", "a config")
    assert re.fullmatch(rf"Google Cloud Storage kept failing: reading gs://{BUCKET}/cfg/bad.json failed "
                        rf"3 tries over \d+ s \(last: {HTTPStatus(code).phrase} \(injected\), "
                        rf"{code}\); "
                        + re.escape(_ADVICE), str(failed.value)), str(failed.value)
    assert faults.refused and set(faults.refused.values()) == {3}, faults.refused
    assert paths.read_json(f"gs://{BUCKET}/cfg/good.json", "a config") == {"a": 1}
    # A download into a local file (fsspec's get; the file system paths registered for gs://).
    import fsspec

    faults.kind, faults.refused = (lambda request: request.command == "GET" and "alt=media" in request.path
                                   and "bad.json" in unquote(request.path)), collections.Counter()
    with pytest.raises(paths.StorageFailing, match=rf"^Google Cloud Storage kept failing: reading "
                                                  rf"gs://{BUCKET}/cfg/bad.json failed 3 tries"):
        fsspec.filesystem("gs").get(f"gs://{BUCKET}/cfg/bad.json", str(tmp_path / "bad.json"))
    assert len(faults.refused) == 1 and set(faults.refused.values()) == {3}, faults.refused
    assert not (tmp_path / "bad.json").exists()
    fsspec.filesystem("gs").get(f"gs://{BUCKET}/cfg/good.json", str(tmp_path / "good.json"))
    assert (tmp_path / "good.json").read_text() == '{"a": 1}'
    # Uploads (each file's first request names it), a run's lock among them.
    faults.kind, faults.refused = (lambda request: request.command == "POST"), collections.Counter()
    with pytest.raises(paths.StorageFailing, match=f"writing gs://{BUCKET}/cfg/new.json failed 3 tries"):
        paths.path(f"gs://{BUCKET}/cfg/new.json").write_text("{}")
    with pytest.raises(paths.StorageFailing, match=rf"^Google Cloud Storage kept failing: writing "
                                                  rf"gs://{BUCKET}/run/run.lock failed 3 tries .*longer\)$"):
        paths.WorkdirLock(f"gs://{BUCKET}/run").__enter__()
    assert len(faults.refused) == 2 and set(faults.refused.values()) == {3}, faults.refused
    faults.kind = lambda request: request.command == "GET" and "bad.json" in unquote(request.path)
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", "tries=1")
    faults.refused.clear()
    with pytest.raises(paths.StorageFailing, match="failed 1 try over"):
        paths.read_json(f"gs://{BUCKET}/cfg/bad.json", "a config")
    assert set(faults.refused.values()) == {1}, faults.refused
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", "tries=0")
    with pytest.raises(ValueError, match=r"\$BERT_JAX_GCS_RETRY=tries=0: 'tries=0' is not one of "
                                         r"tries=<number>, first_wait_s=<number>"):
        paths.path(f"gs://{BUCKET}/cfg/good.json")


def test_the_retry_policy_holds_with_a_gcsfs_whose_methods_keep_no_wrapped(failing_gcs, monkeypatch):
    """A gcsfs version whose request method keeps no `__wrapped__` (here: the undecorated one,
    passed through a plain function) and has no `_get_file_concurrent`: the policy's file system
    still builds (nothing made up for the missing method) and a read that keeps failing is tried
    exactly the policy's 3 times, then named in one line."""
    import fsspec

    from bert_jax import paths

    fs, faults = failing_gcs
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    gcsfs_class = gcsfs_core.GCSFileSystem
    undecorated, calls = gcsfs_class._request.__wrapped__, []

    async def request(self, *args, **kwargs):  # no __wrapped__: gcsfs's retries are not on it
        calls.append(args[0])
        return await undecorated(self, *args, **kwargs)

    monkeypatch.setattr(gcsfs_class, "_request", request)
    monkeypatch.delattr(gcsfs_class, "_get_file_concurrent")
    for protocol in ("gs", "gcs"):  # as before the first gs:// path: gcsfs's own class
        monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, protocol, gcsfs_class)
    monkeypatch.setattr(paths, "_POLICY_FS", {})
    _forget_gcs_clients()
    fs.pipe(f"{BUCKET}/cfg/bad.json", b'{"a": 2}')
    faults.kind = lambda request: request.command == "GET" and "bad.json" in unquote(request.path)
    calls.clear()
    with pytest.raises(paths.StorageFailing, match=rf"^Google Cloud Storage kept failing: reading "
                                                  rf"gs://{BUCKET}/cfg/bad.json failed 3 tries"):
        paths.read_json(f"gs://{BUCKET}/cfg/bad.json", "a config")
    policy_fs = fsspec.get_filesystem_class("gs")
    assert policy_fs.__name__ == "PolicyGCSFileSystem" and not hasattr(policy_fs, "_get_file_concurrent")
    # each request refused (the object's, then a folder's of that name) tried 3 times, no more
    assert set(faults.refused.values()) == {3}, faults.refused
    assert len(calls) == faults.refused.total(), calls
    faults.kind = None
    assert paths.read_json(f"gs://{BUCKET}/cfg/bad.json", "a config") == {"a": 2}


def _shard_documents(shift: int) -> list:
    return [[np.arange(i, i + 3, dtype=np.int32) + shift, np.array([7, i], np.int32)] for i in range(5)]


def _as_lists(docs) -> list:
    return [[s.tolist() for s in docs[i]] for i in range(len(docs))]


def _files_kept(cache) -> list:
    """The files in a shard cache (copies, records, parts), not its lists of the copies each
    process took (.readers)."""
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")
                  if p.is_file() and p.relative_to(cache).parts[0] != ".readers")


def test_gs_shards_are_copied_under_the_retry_policy_then_read_from_the_copy(failing_gcs, monkeypatch,
                                                                           tmp_path):
    """array_record shards on gs:// are downloaded into the shard cache by gcsfs, each request
    under the retry policy (array_record's own reader would retry by google-cloud-cpp's rules):
    a download that keeps failing stops after the policy's 3 tries in one line, leaving nothing
    in the cache; once GCS is well the documents read are the ones written, the next read takes
    the copy without downloading, and a shard rewritten since (same size) is downloaded again."""
    from bert_jax import paths
    from bert_jax.data import documents

    fs, faults = failing_gcs
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    cache = tmp_path / "shards"
    monkeypatch.setenv("BERT_JAX_SHARD_CACHE", str(cache))
    shard = f"gs://{BUCKET}/shards/train-00000.array_record"
    assert documents.write_array_record(_shard_documents(0), shard) == 5
    downloads = []

    def download(request) -> bool:
        path = unquote(request.path)
        if request.command == "GET" and "alt=media" in path and "train-00000" in path:
            downloads.append(request.path)
            return refuse
        return False

    def read():
        return documents.ArrayRecordDocuments(documents.expand(f"gs://{BUCKET}/shards/train-*"))

    faults.kind, refuse = download, True
    with pytest.raises(paths.StorageFailing, match=rf"^Google Cloud Storage kept failing: reading "
                                                  rf"{shard} failed 3 tries .*longer\)$"):
        read()
    assert set(faults.refused.values()) == {3} and len(downloads) == 3, (faults.refused, downloads)
    assert _files_kept(cache) == []  # nothing partial, nothing recorded
    refuse = False
    downloads.clear()
    assert _as_lists(read()) == _as_lists(_shard_documents(0)) and len(downloads) == 1
    assert (cache / BUCKET / "shards" / "train-00000.array_record").is_file()
    assert _as_lists(read()) == _as_lists(_shard_documents(0)) and len(downloads) == 1  # the copy
    documents.write_array_record(_shard_documents(100), shard)  # the same size, other bytes
    assert _as_lists(read()) == _as_lists(_shard_documents(100)) and len(downloads) == 2


def test_gs_shards_whose_copies_cannot_be_written_are_read_from_the_bucket(failing_gcs, monkeypatch,
                                                                          tmp_path):
    """A disk that refuses the copy while it is written (here a file-size limit below the shard's
    size, as a full disk or a quota would): one warning line naming the folder and the error,
    nothing half-written left, and the documents read from the bucket."""
    import resource
    import signal

    from bert_jax.data import documents

    cache = tmp_path / "shards"
    monkeypatch.setenv("BERT_JAX_SHARD_CACHE", str(cache))
    shard = f"gs://{BUCKET}/shards/train-00000.array_record"
    documents.write_array_record(_shard_documents(0), shard)  # 128 KiB on GCS
    warned = []
    monkeypatch.setattr(documents.logging.getLogger(documents.__name__), "warning", warned.append)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    try:
        stored = documents.ArrayRecordDocuments([shard])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert _as_lists(stored) == _as_lists(_shard_documents(0))
    assert warned == [f"warning: the shard cache cannot write copies in {cache} (File too large); reading "
                      "the shards from the bucket instead (array_record's own GCS client: its retries, "
                      "not $BERT_JAX_GCS_RETRY's); set $BERT_JAX_SHARD_CACHE to a folder with room (or "
                      "to off, to read the bucket without this line)"], warned
    assert _files_kept(cache) == []


def test_a_shard_rewritten_while_it_is_copied_is_refused_and_a_killed_copys_part_removed(
        failing_gcs, monkeypatch, tmp_path):
    """The bytes downloaded must have the MD5 GCS listed for the object (a shard rewritten with
    the same size between the listing and the download): one line, nothing kept. A part file a
    killed download of this machine left is removed at the next copy."""
    import socket

    from bert_jax import paths
    from bert_jax.data import documents

    shard = f"gs://{BUCKET}/shards/train-00000.array_record"
    documents.write_array_record(_shard_documents(0), shard)
    cache = tmp_path / "shards"
    list_objects = gcsfs_core.GCSFileSystem._list_objects

    async def listed_before_a_rewrite(self, path, **kwargs):
        listed = await list_objects(self, path, **kwargs)
        return [{**o, "md5Hash": "kAFQmDzST7DWlj99KOF/cg=="} for o in listed]

    monkeypatch.setattr(gcsfs_core.GCSFileSystem, "_list_objects", listed_before_a_rewrite)
    with pytest.raises(OSError, match=rf"^{shard}: the bytes downloaded are not those GCS listed "
                                      r"for it \(131072 bytes, 131072 listed; or another MD5\): it "
                                      r"was rewritten while it was copied; rerun$"):
        paths.cached_copies([shard], cache)
    assert _files_kept(cache) == []
    monkeypatch.setattr(gcsfs_core.GCSFileSystem, "_list_objects", list_objects)
    killed = cache / BUCKET / "shards" / f".train-00000.array_record.{socket.gethostname()}.999999.part"
    killed.write_bytes(b"half")
    (copy,) = paths.cached_copies([shard], cache)
    assert not killed.exists()
    assert _as_lists(documents.ArrayRecordDocuments([str(copy)])) == _as_lists(_shard_documents(0))


def test_processes_of_one_machine_copy_each_shard_once(failing_gcs, monkeypatch, tmp_path):
    """Several processes (threads here: the lock is the folder's) opening the same gs:// shards
    at once: one downloads each shard, the others wait for it and take its copies."""
    import threading

    from bert_jax import paths
    from bert_jax.data import documents

    fs, faults = failing_gcs
    shards = [f"gs://{BUCKET}/shards/train-0000{i}.array_record" for i in range(2)]
    for i, shard in enumerate(shards):
        documents.write_array_record(_shard_documents(10 * i), shard)
    downloads = []

    def count(request) -> bool:
        if request.command == "GET" and "alt=media" in unquote(request.path):
            downloads.append(request.path)
        return False

    faults.kind = count
    results, errors = [], []

    def copy():
        try:
            results.append(paths.cached_copies(shards, tmp_path / "shards"))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=copy) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 3 and len({tuple(r) for r in results}) == 1
    assert len(downloads) == 2, downloads
    for i, copy in enumerate(results[0]):
        assert _as_lists(documents.ArrayRecordDocuments([str(copy)])) == _as_lists(_shard_documents(10 * i))


def _metadata_or_download(seen: collections.Counter):
    """A Faults.kind refusing nothing, counting the object reads (downloads) and the other
    reads (listings, an object's metadata) by the path they ask for."""
    def kind(request) -> bool:
        path = unquote(request.path)
        if request.command == "GET":
            what = urlparse(path).path.rsplit("/o", 1)[-1] or "list"  # (an object's name)
            seen["download" if "alt=media" in path else what] += 1
        return False
    return kind


def test_shard_metadata_comes_from_one_listing_a_folder_not_a_request_a_shard(failing_gcs, monkeypatch,
                                                                              tmp_path):
    """20 shards in one folder and 2 in another: their sizes, generations and MD5s come from one
    listing a folder (2 requests, not 20 or more), under the retry policy (a listing that keeps
    failing: the policy's 3 tries, one line); the copies hold the objects' bytes, a second call
    downloads nothing, a shard rewritten (same size) is downloaded again. A download that keeps
    failing among several (a few run at once) leaves the others whole and itself nothing; a
    missing object or a bucket's URL is one line, nothing copied."""
    from bert_jax import paths

    fs, faults = failing_gcs
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    cache = tmp_path / "shards"
    names = [f"shards/train-{i:05d}.array_record" for i in range(20)] + [
        f"more/valid-{i:05d}.array_record" for i in range(2)]
    for i, name in enumerate(names):
        fs.pipe(f"{BUCKET}/{name}", f"shard {i:03d} ".encode() * 50)
    fs.pipe(f"{BUCKET}/shards/other.txt", b"not wanted")
    urls = [f"gs://{BUCKET}/{name}" for name in names]
    seen = collections.Counter()
    faults.kind = _metadata_or_download(seen)
    copies = paths.cached_copies(urls, cache)
    assert seen == {"list": 2, "download": 22}, seen  # no request for one object's metadata
    assert copies == [cache / BUCKET / name for name in names]
    assert [c.read_bytes() for c in copies] == [f"shard {i:03d} ".encode() * 50 for i in range(22)]
    seen.clear()
    assert paths.cached_copies(urls, cache) == copies and seen == {"list": 2}, seen
    fs.pipe(f"{BUCKET}/{names[7]}", b"rewritten " * 50)  # the same size
    seen.clear()
    assert paths.cached_copies(urls, cache) == copies and seen == {"list": 2, "download": 1}, seen
    assert copies[7].read_bytes() == b"rewritten " * 50

    # A listing that keeps failing: retried by the policy, then one line naming it.
    faults.kind = lambda request: request.command == "GET" and "alt=media" not in request.path
    with pytest.raises(paths.StorageFailing, match=rf"^Google Cloud Storage kept failing: listing "
                                                  rf"gs://{BUCKET}/shards/train-0000 failed 3 tries"):
        paths.cached_copies(urls[:10], cache)
    assert set(faults.refused.values()) == {3}, faults.refused

    # One download of several keeps failing: the others are whole copies with their records.
    for i, name in enumerate(names[:6]):
        fs.pipe(f"{BUCKET}/{name}", f"second {i:02d} ".encode() * 50)
    faults.kind = lambda request: "alt=media" in request.path and "train-00003" in unquote(request.path)
    with pytest.raises(paths.StorageFailing, match=rf"reading gs://{BUCKET}/{names[3]} failed 3 tries"):
        paths.cached_copies(urls[:6], cache)
    # (its old copy, which no record vouches for any more, removed with the failure)
    assert not copies[3].exists() and not (cache / BUCKET / (names[3] + ".source")).exists()
    for i in (0, 1, 2, 4, 5):
        assert copies[i].read_bytes() == f"second {i:02d} ".encode() * 50
    assert not [f for f in _files_kept(cache) if f.endswith(".part") or "/." in f]
    faults.kind = None
    kept = _files_kept(cache)
    with pytest.raises(FileNotFoundError, match=rf"^gs://{BUCKET}/shards/nothing\.array_record: no such "
                                                r"object; check the path$"):
        paths.cached_copies([urls[0], f"gs://{BUCKET}/shards/nothing.array_record"], cache)
    with pytest.raises(FileNotFoundError, match=rf"^gs://{BUCKET}/gone/x: no such object"):
        paths.cached_copies([f"gs://{BUCKET}/gone/x"], cache)  # (no such folder either)
    with pytest.raises(ValueError, match=rf"^gs://{BUCKET}/: names a bucket, not an object; give the "
                                         r"shard's gs:// path$"):
        paths.cached_copies([f"gs://{BUCKET}/"], cache)
    assert _files_kept(cache) == kept


def test_shards_whose_names_share_no_prefix_list_only_their_own_names(failing_gcs, tmp_path):
    """Shards named with nothing in common (`alpha-1`, `alpha-2`, `omega-1`) in a folder of many
    other objects: each listing asks for a prefix of the wanted names (`alpha-`, `omega-1`), not
    for the whole folder (prefix ''), and the copies hold the objects' bytes."""
    from bert_jax import paths

    fs, faults = failing_gcs
    wanted = ["mixed/alpha-1", "mixed/alpha-2", "mixed/omega-1"]
    for i, name in enumerate(wanted):
        fs.pipe(f"{BUCKET}/{name}", f"wanted {i}".encode())
    for i in range(30):
        fs.pipe(f"{BUCKET}/mixed/middle-{i:03d}", b"not wanted")
    asked = []

    def kind(request) -> bool:
        url = urlparse(request.path)
        if request.command == "GET" and url.path.endswith("/o"):  # a listing
            asked.append(parse_qs(url.query).get("prefix", [""])[0])
        return False
    faults.kind = kind
    copies = paths.cached_copies([f"gs://{BUCKET}/{name}" for name in wanted], tmp_path)
    assert sorted(asked) == ["mixed/alpha-", "mixed/omega-1"], asked
    assert [c.read_bytes() for c in copies] == [f"wanted {i}".encode() for i in range(3)]


# A process of this machine that copies shards (cached_copies): a line of gs:// URLs on its
# input, "copied" on its output once they are there; it ends when its input does.
_COPIER = """import sys
from bert_jax import paths
for line in sys.stdin:
    paths.cached_copies(line.split(), sys.argv[1])
    print("copied", flush=True)
"""


def _copier(cache, *urls: str) -> subprocess.Popen:
    """A copying process (its emulator: this process's environment) that has copied `urls`."""
    proc = subprocess.Popen([sys.executable, "-c", _COPIER, str(cache)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(" ".join(urls) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "copied\n", proc.communicate()
    return proc


def _ended(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def test_copies_no_live_process_took_are_evicted_least_recently_used_first(failing_gcs, monkeypatch,
                                                                         tmp_path):
    """The folder's copies may hold half the room they and the disk's free space make (here a
    disk with 256 KiB free): past it, the copies least recently used (a reuse counts) that no
    running process of this machine took are removed, record first; those a process still
    running took (another one, or this one) stay, and so does a file that is no copy (no
    record). A download that would not fit even with every such copy removed is one line,
    and nothing is removed."""
    from bert_jax import paths

    fs, faults = failing_gcs
    cache, kib = tmp_path / "shards", 1024
    urls = {}
    for name, size in (("a0", 64), ("a1", 64), ("a2", 64), ("a3", 64), ("big", 256)):
        fs.pipe(f"{BUCKET}/shards/{name}", name.encode()[-1:] * (size * kib))
        urls[name] = f"gs://{BUCKET}/shards/{name}"
    copy = {name: cache / BUCKET / "shards" / name for name in urls}
    record = {name: cache / BUCKET / "shards" / f"{name}.source" for name in urls}
    _ended(_copier(cache, urls["a0"], urls["a1"]))  # a run gone since
    os.utime(record["a0"], (1000, 1000))
    os.utime(record["a1"], (2000, 2000))
    _ended(_copier(cache, urls["a0"]))  # another one, gone too, used a0 again
    assert record["a0"].stat().st_mtime > 2000 and record["a1"].stat().st_mtime == 2000
    running = _copier(cache, urls["a2"])
    # A list of this host no live process holds (its lock free: a gone process, of another
    # container too, whatever its pid names now: 1 runs) protects nothing and is removed; the
    # running one's is held; another host's is kept (locks may not cross machines).
    (cache / ".readers" / f"{socket.gethostname()}.1").write_text(f"{BUCKET}/shards/a1\n")
    (cache / ".readers" / "elsewhere.1").write_text(f"{BUCKET}/shards/zz\n")
    mine = cache / BUCKET / "shards" / "notes.txt"  # not a copy (no record): never removed
    mine.write_text("mine")
    os.utime(mine, (0, 0))
    try:
        disk = collections.namedtuple("usage", "total used free")
        monkeypatch.setattr(paths.shutil, "disk_usage", lambda folder: disk(2**30, 2**30, 256 * kib))
        # 3 copies of 64 KiB held, 64 KiB more: 256 KiB > (256 + 192) / 2 = 224 KiB: one goes.
        assert paths.cached_copies([urls["a3"]], cache) == [copy["a3"]]
        assert _files_kept(cache) == [f"{BUCKET}/shards/{name}{suffix}" for name in ("a0", "a2", "a3")
                                      for suffix in ("", ".source")] + [f"{BUCKET}/shards/notes.txt"]
        assert copy["a3"].read_bytes() == b"3" * (64 * kib)
        readers = sorted(p.name for p in (cache / ".readers").iterdir())  # the gone ones' lists removed
        assert readers == sorted([*(f"{socket.gethostname()}.{pid}" for pid in (running.pid, os.getpid())),
                                  "elsewhere.1"])
        # 256 KiB more needs 512 KiB free: 256 KiB and a0's 64 KiB (a2: the running one's, a3: ours).
        with pytest.raises(paths.CopyFolderUnusable, match=(
                rf"^{re.escape(str(cache))} has 256.0 KiB free and 64.0 KiB in copies no process uses "
                r"now, the copies need 256.0 KiB \(and may take at most half of both\)$")):
            paths.cached_copies([urls["big"]], cache)
        assert _files_kept(cache) == [f"{BUCKET}/shards/{name}{suffix}" for name in ("a0", "a2", "a3")
                                      for suffix in ("", ".source")] + [f"{BUCKET}/shards/notes.txt"]
    finally:
        _ended(running)
    # Once it ended, its copy may go too: with 384 KiB free, a0 and a2 make room for big.
    monkeypatch.setattr(paths.shutil, "disk_usage", lambda folder: disk(2**30, 2**30, 384 * kib))
    assert paths.cached_copies([urls["big"]], cache) == [copy["big"]]
    assert _files_kept(cache) == [f"{BUCKET}/shards/{name}{suffix}" for name in ("a3", "big")
                                  for suffix in ("", ".source")] + [f"{BUCKET}/shards/notes.txt"]
    assert copy["big"].read_bytes() == b"g" * (256 * kib)

    # A list this process cannot write (a full disk): one line, and no copy is read.
    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (cache / ".readers" / f"{socket.gethostname()}.{os.getpid()}").unlink()  # (written again)
    monkeypatch.setattr(paths, "_append", full)
    with pytest.raises(paths.CopyFolderUnusable, match=rf"^cannot note this process's copies in "
                                                       rf"{re.escape(str(cache))}/.readers/.*No space"):
        paths.cached_copies([urls["a3"]], cache)


def test_gs_shards_without_room_for_copies_are_read_from_the_bucket_after_one_line(failing_gcs,
                                                                                  monkeypatch, tmp_path):
    """A shard cache whose disk has no room for the shards (they may take half its free room:
    a run's checkpoints may share it): one warning line naming the folder,
    the room and what to do; the shards are then read from the bucket by array_record itself
    (as with BERT_JAX_SHARD_CACHE=off, which says nothing)."""
    import collections as collections_lib

    from bert_jax import paths
    from bert_jax.data import documents

    fs, faults = failing_gcs
    cache = tmp_path / "shards"
    monkeypatch.setenv("BERT_JAX_SHARD_CACHE", str(cache))
    shard = f"gs://{BUCKET}/shards/train-00000.array_record"
    documents.write_array_record(_shard_documents(0), shard)
    disk = collections_lib.namedtuple("usage", "total used free")
    monkeypatch.setattr(paths.shutil, "disk_usage", lambda folder: disk(2**30, 2**30, 200 * 1024))
    warned = []
    monkeypatch.setattr(documents.logging.getLogger(documents.__name__), "warning", warned.append)
    stored = documents.ArrayRecordDocuments([shard])
    assert _as_lists(stored) == _as_lists(_shard_documents(0))
    assert fs.info(f"{BUCKET}/shards/train-00000.array_record")["size"] == 128 * 1024  # (padded)
    assert warned == [
        f"warning: the shard cache {cache} has 200.0 KiB free, the copies need 128.0 KiB (and "
        "may take at most half of it); reading the shards from the bucket instead (array_record's "
        "own GCS client: its retries, not $BERT_JAX_GCS_RETRY's); set $BERT_JAX_SHARD_CACHE to a "
        "folder with room (or to off, to read the bucket without this line)"]
    assert _files_kept(cache) == []
    monkeypatch.setenv("BERT_JAX_SHARD_CACHE", "off")
    assert _as_lists(documents.ArrayRecordDocuments([shard])) == _as_lists(_shard_documents(0))
    assert len(warned) == 1


def test_a_gs_cache_whose_writes_keep_failing_is_turned_off_after_one_program(failing_gcs, monkeypatch):
    """A gs:// compilation cache that passed the probe, whose uploads of programs then keep
    failing (503 past the policy's 3 tries): the first program's upload is tried 3 times, the
    cache is turned off with one line, and later programs make no request to the bucket (JAX
    alone would pay the policy's retries at every program)."""
    from bert_jax.training import compilation_cache

    fs, faults = failing_gcs
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    cache = f"gs://{BUCKET}/jit"
    warned = []
    monkeypatch.setattr(compilation_cache.logging.getLogger(compilation_cache.__name__), "warning",
                        warned.append)
    with jax_cache_of_the_test():
        compilation_cache.setup_compilation_cache(cache, "translate", None)
        faults.kind = lambda request: request.command == "POST" and "-cache" in unquote(request.path)
        compile_new_program(3.25)
        assert len(faults.refused) == 1 and set(faults.refused.values()) == {3}, faults.refused
        assert jax.config.jax_enable_compilation_cache is False
        asked = faults.requests
        compile_new_program(4.25)
        compile_new_program(5.25)
        assert faults.requests == asked  # off: not a request more
    assert len(warned) == 1 and re.fullmatch(
        rf"warning: the compilation cache {cache} failed writing a compiled program \(StorageFailing: "
        rf"Google Cloud Storage kept failing: writing gs://{BUCKET}/jit/jit_.*-cache failed 3 tries "
        r".*\); running on without it \(every program compiles from now on; "
        r"--compilation_cache_required stops the command instead\)", warned[0]), warned


def test_the_retry_policy_and_its_deadline(monkeypatch):
    from bert_jax import paths

    policy = paths.retry_policy()
    assert policy == paths.RetryPolicy()
    assert policy.waits() == [1, 2, 4, 8, 16] and policy.deadline_s == 31 + 6 * 30
    assert paths.tensorstore_retries(policy) == {"max_retries": 5, "initial_delay": "1.0s",
                                                 "max_delay": "16.0s"}
    assert paths.RetryPolicy(tries=8, max_wait_s=10).waits() == [1, 2, 4, 8, 10, 10, 10]
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", "tries=10, max_wait_s=32")  # docs/training.md's
    assert paths.retry_policy() == paths.RetryPolicy(tries=10, max_wait_s=32)
    assert paths.retry_policy().deadline_s == 1 + 2 + 4 + 8 + 16 + 4 * 32 + 10 * 30
    for bad in ("tries=2.5", "stall_s=0", "first_wait_s=-1", "wait=3", "tries"):
        monkeypatch.setenv("BERT_JAX_GCS_RETRY", bad)
        with pytest.raises(ValueError, match=rf"BERT_JAX_GCS_RETRY={bad}: '{bad}' is not one of"):
            paths.retry_policy()


@RETRIED
def test_checkpoint_writes_that_keep_failing_stop_in_one_line_and_the_last_checkpoint_stays(
        failing_gcs, monkeypatch, code):
    """Every tensorstore upload into checkpoint 2 answered `code`: each is tried the policy's 3
    times (tensorstore alone: 33), the save fails as a store that kept failing (not as
    damaged files), and checkpoint 1, written before, restores as it was saved."""
    from bert_jax.training import checkpoint

    fs, faults = failing_gcs
    faults.code = code
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    root = f"gs://{BUCKET}/arrays"
    params = {"dense": {"kernel": np.arange(12, dtype=np.float32).reshape(3, 4)}}
    checkpoint.save_params(root, 1, params, {"model": {}})
    faults.kind = _tensorstore("POST", 2)
    with pytest.raises(Exception) as failed:  # noqa: PT011 (Orbax's own wrapping of the failure)
        checkpoint.save_params(root, 2, params, {"model": {}})
    line = checkpoint.storage_failure(failed.value, f"{root}/checkpoints", "saving a checkpoint in")
    assert str(line) == (f"Google Cloud Storage kept failing: saving a checkpoint in {root}/checkpoints "
                         f"failed 3 tries (last: HTTP {code} {HTTPStatus(code).phrase} (injected)); "
                         f"{_ADVICE}")
    assert faults.refused and max(faults.refused.values()) == 3, faults.refused  # never more
    faults.kind = None
    abstract = {"dense": {"kernel": jax.ShapeDtypeStruct((3, 4), np.float32)}}
    restored = checkpoint.restore_params(root, abstract, 1)
    np.testing.assert_array_equal(restored["dense"]["kernel"], params["dense"]["kernel"])


@pytest.mark.slow  # 20-45 s: three training runs in-process; the two tests above are the quick ones
def test_a_store_that_keeps_failing_stops_a_run_in_one_line_and_it_resumes(failing_gcs, cli, monkeypatch):
    """A run whose checkpoint 4 cannot be written (every tensorstore upload into it answered
    503) after checkpoint 2 was: it stops with one line naming the checkpoints and the last
    complete step, each request tried 3 times ($BERT_JAX_GCS_RETRY); rerun with GCS well
    again, it resumes from step 2."""
    fs, faults = failing_gcs
    monkeypatch.setenv("BERT_JAX_GCS_RETRY", _FAST_RETRIES)
    root, workdir = f"{BUCKET}/failing", f"gs://{BUCKET}/failing"
    train = ["train", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL, "--config.train.steps=4",
             "--config.train.checkpoint_every=2", "--config.train.eval_steps=1",
             "--config.schedule.warmup_steps=1"]
    faults.kind = _tensorstore("POST", 4)
    code, out, err = cli(train)
    assert code == 1, err[-3000:]
    assert max(faults.refused.values()) == 3, faults.refused  # tried 3 times, never more
    assert err.splitlines()[-1] == (
        f"bert-jax train: error: Google Cloud Storage kept failing: saving a checkpoint in {workdir}/"
        f"checkpoints failed 3 tries (last: HTTP 503 Service Unavailable (injected)); {_ADVICE}; the "
        "last complete checkpoint is step 2")
    assert "Traceback" not in err
    faults.kind = None
    code, out, err = cli(train)
    assert code == 0, err[-3000:]
    assert f"resumed from {workdir}/checkpoints/2" in out, out[-2000:]
    assert listing(fs, f"{root}/checkpoints") == ["2", "4"]
    # Its reads failing: a resume stops in one line too, and checkpoint 4 is not set aside as
    # unreadable (as damaged files are): the next run with GCS well resumes from it.
    faults.kind, faults.refused = _tensorstore("GET", 4), collections.Counter()
    code, out, err = cli([*train, "--config.train.steps=6"])
    assert code == 1, err[-3000:]
    assert max(faults.refused.values()) == 3, faults.refused
    assert err.splitlines()[-1] == (
        f"bert-jax train: error: Google Cloud Storage kept failing: restoring {workdir}/checkpoints/4 "
        f"failed 3 tries (last: HTTP 503 Service Unavailable (injected)); {_ADVICE}")
    assert listing(fs, f"{root}/checkpoints") == ["2", "4"]


def test_launch_checks_the_workdir_is_writable(gcs):
    """`bert-jax launch` writes and deletes a probe in the workdir before creating capacity; a
    bucket that does not exist is named (and not created)."""
    fs, env = gcs
    check = "from bert_jax.cloud import bringup; bringup.check_workdir({!r}, dry_run=False)"
    ok = subprocess.run([sys.executable, "-c", check.format(f"gs://{BUCKET}/probed")], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert not fs.exists(f"{BUCKET}/probed") or listing(fs, f"{BUCKET}/probed") == []
    bad = subprocess.run([sys.executable, "-c", check.format("gs://no-such-bucket/run")], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "cannot write to the workdir gs://no-such-bucket/run" in bad.stderr
    assert "no-such-bucket" not in [b.rstrip("/") for b in fs.ls("")]


def _book(shared_data, name: str, lines: int) -> bytes:
    return b"\n".join((shared_data / "text" / "gutenberg" / name).read_bytes().splitlines()[:lines])


@pytest.fixture(scope="module")
def corpus(gcs_here, shared_data):
    """gs://bucket/corpus/: a plain and a gzipped book excerpt, with what a real bucket may also
    hold beside them: the Cloud Console's zero-byte `corpus/` folder marker, a subfolder, and a
    hidden file; a glob `corpus/*` must read only the two books."""
    fs = gcs_here
    fs.pipe(f"{BUCKET}/corpus/", b"")
    fs.pipe(f"{BUCKET}/corpus/emma.txt", _book(shared_data, "austen-emma.txt", 1500))
    fs.pipe(f"{BUCKET}/corpus/ball.txt.gz", gzip.compress(_book(shared_data, "chesterton-ball.txt", 1500)))
    fs.pipe(f"{BUCKET}/corpus/old/", b"")
    fs.pipe(f"{BUCKET}/corpus/old/draft.txt", b"not part of the corpus\n")
    fs.pipe(f"{BUCKET}/corpus/.partial", b"\xff half an upload")
    return f"gs://{BUCKET}/corpus"


@pytest.fixture(scope="module")
def vocab(corpus):
    """gs://bucket/vocab: a WordPiece vocab of the corpus, written to the bucket."""
    from bert_jax.data import tokenizer as tokenizer_lib
    from bert_jax.data.sources import vocab_lines as text_lines

    return str(tokenizer_lib.train_vocab(text_lines(f"{corpus}/*"), size=1000, kind="wordpiece",
                                         out_dir=f"gs://{BUCKET}/vocab"))


def test_globs_on_gs_match_what_a_local_glob_would(corpus, gcs_here):
    from bert_jax import paths
    from bert_jax.data import documents

    assert paths.glob(f"{corpus}/*") == [f"{corpus}/ball.txt.gz", f"{corpus}/emma.txt"]
    assert paths.glob(f"{corpus}/[e]*.txt") == [f"{corpus}/emma.txt"]
    assert paths.glob(f"{corpus}/**") == paths.glob(f"{corpus}/*")  # ** is one level, as glob.glob
    assert paths.glob(f"{corpus}/*/*.txt") == [f"{corpus}/old/draft.txt"]
    assert paths.glob(f"{corpus}/.p*") == [f"{corpus}/.partial"]
    assert paths.glob(f"{corpus}/emma.txt") == [f"{corpus}/emma.txt"]
    # A file another client wrote after a listing is seen (gcsfs caches listings).
    other = gcsfs_core.GCSFileSystem(endpoint_url=os.environ["STORAGE_EMULATOR_HOST"], token="anon",
                                     skip_instance_cache=True)
    other.pipe(f"{BUCKET}/late/a.txt", b"a")
    assert paths.glob(f"gs://{BUCKET}/late/*") == [f"gs://{BUCKET}/late/a.txt"]
    other.pipe(f"{BUCKET}/late/b.txt", b"b")
    assert paths.glob(f"gs://{BUCKET}/late/*") == [f"gs://{BUCKET}/late/a.txt", f"gs://{BUCKET}/late/b.txt"]
    with pytest.raises(FileNotFoundError, match=r"data.train_files=.*no file matches 'gs://bucket/nope/\*'"):
        documents.expand(f"gs://{BUCKET}/nope/*", "data.train_files")


def test_vocab_from_gs_text_into_gs(corpus, vocab, gcs_here, cli):
    fs = gcs_here
    code, out, err = cli(["vocab", "--input", f"{corpus}/*", "--size", "1000", "--out",
                          f"gs://{BUCKET}/vocab_cli"])
    assert code == 0, err
    assert json.loads(out.splitlines()[-1]) == {"out": f"gs://{BUCKET}/vocab_cli", "kind": "wordpiece",
                                                "vocab_size": 1000}
    assert listing(fs, f"{BUCKET}/vocab_cli") == ["bert_jax_tokenizer.json", "tokenizer_config.json",
                                                 "vocab.txt"]
    assert fs.cat(f"{BUCKET}/vocab_cli/vocab.txt") == fs.cat(f"{BUCKET}/vocab/vocab.txt")
    assert b"draft" not in fs.cat(f"{BUCKET}/vocab/vocab.txt")  # the subfolder's file was not read


def test_pretraining_from_gs_text_and_tokenizer(corpus, vocab, gcs_here, cli, tmp_path):
    """The config docstring's pod command, on a CPU: text globs and tokenizer on gs://."""
    fs = gcs_here
    workdir = tmp_path / "run"
    code, out, err = cli(["train", f"--config={CONFIG}", f"--workdir={workdir}",
                          f"--config.data.tokenizer={vocab}",
                          f"--config.data.train_files={corpus}/*", "--config.model.vocab_size=1000",
                          "--config.train.steps=2", "--config.train.batch_size=8",
                          "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
                          "--config.train.eval_steps=1", "--config.data.heldout_every=5",
                          "--config.schedule.warmup_steps=1",
                          # the files' place is the point, not the model: one narrow layer
                          "--config.model.num_layers=1", "--config.model.emb_dim=32",
                          "--config.model.num_heads=2", "--config.model.head_dim=16",
                          "--config.model.mlp_dim=64"])
    assert code == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1])["step"] == 2
    # The workdir carries the tokenizer (so it can be an init_from), copied from the bucket.
    assert (workdir / "vocab.txt").read_bytes() == fs.cat(f"{BUCKET}/vocab/vocab.txt")


def test_sentencepiece_tokenizer_on_gs(corpus, gcs_here, cli):
    from bert_jax.data import tokenizer as tokenizer_lib

    code, _, err = cli(["vocab", "--input", f"{corpus}/emma.txt", "--size", "400", "--type",
                        "sentencepiece", "--out", f"gs://{BUCKET}/spm"])
    assert code == 0, err
    tok = tokenizer_lib.load_tokenizer(f"gs://{BUCKET}/spm")
    assert tok.kind == "sentencepiece" and tok.vocab_size <= 400
    assert tok.decode(tok.encode("Emma was happy.")).lower() == "emma was happy."
    with pytest.raises(FileNotFoundError, match=f"no tokenizer in gs://{BUCKET}/corpus:"):
        tokenizer_lib.load_tokenizer(corpus)  # named as given, not as gs:/bucket/corpus


def test_prepared_array_record_shards_on_gs(corpus, vocab, gcs_here, cli, monkeypatch, tmp_path):
    """`prepare --out gs://...` uploads the shards; training reads them from the bucket as it
    reads the text: through local copies (the shard cache), or, with the cache off, by the
    array_record reader opening gs:// itself."""
    monkeypatch.setenv("BERT_JAX_SHARD_CACHE", str(tmp_path / "shards"))
    from bert_jax import config as config_lib
    from bert_jax.data import documents, sources
    from bert_jax.data import tokenizer as tokenizer_lib
    from bert_jax.training import input as pipelines

    text = [f"data.tokenizer=gs://{BUCKET}/vocab", f"data.train_files={corpus}/*",
            "model.vocab_size=1000", "data.heldout_every=5", "data.max_seq_length=32",
            "data.max_predictions_per_seq=5", "train.batch_size=8"]
    shards = f"gs://{BUCKET}/shards"
    code, out, err = cli(["prepare", f"--config={CONFIG}", f"--out={shards}",
                          *(f"--config.{o}" for o in text)])
    assert code == 0, err
    counts = json.loads(out.splitlines()[0])["documents"]
    assert listing(gcs_here, f"{BUCKET}/shards") == ["train-00000.array_record",
                                                    "validation-00000.array_record"]
    text_config = config_lib.load(CONFIG, text)
    tok = tokenizer_lib.load_tokenizer(text_config.data.tokenizer)
    docs, train_ids = pipelines.open_documents(text_config, "train", tok)
    stored = documents.ArrayRecordDocuments(documents.expand(f"{shards}/train-*"))
    assert len(stored) == counts["train"] == len(train_ids)
    for i in (0, len(stored) - 1):  # the same documents and token ids as the text gives
        assert [s.tolist() for s in stored[i]] == [s.tolist() for s in docs[int(train_ids[i])]]
    assert (tmp_path / "shards" / BUCKET / "shards" / "train-00000.array_record").is_file()
    monkeypatch.setenv("BERT_JAX_SHARD_CACHE", "off")
    direct = documents.ArrayRecordDocuments(documents.expand(f"{shards}/train-*"))
    assert [s.tolist() for s in direct[len(stored) - 1]] == [s.tolist() for s in stored[len(stored) - 1]]
    monkeypatch.delenv("BERT_JAX_SHARD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default folder
    config = config_lib.load(CONFIG, text + ["data.name=array_record", f"data.train_files={shards}/train-*",
                                             f"data.eval_files={shards}/validation-*"])
    assert next(pipelines.make(config, "train"))["input_ids"].shape == (8, 32)
    copies = tmp_path / "xdg" / "bert_jax" / "shards" / BUCKET / "shards"
    assert sorted(p.name for p in copies.iterdir()) == ["train-00000.array_record",
                                                        "train-00000.array_record.source"]
    with pytest.raises(FileExistsError, match=f"--out={shards}: not empty"):
        sources.prepare(config_lib.resolve(text_config), shards)



@pytest.mark.slow  # ~25 s: Orbax saves and restores through the emulator
def test_checkpoint_tools_read_and_write_gs(vocab, gcs_here):
    """features, export and convert with every input and output in the bucket (a tiny BERT
    checkpoint saved there with its gs:// tokenizer, as a gs:// training workdir holds them)."""
    from flax import nnx

    from bert_jax import models
    from bert_jax.data import tokenizer as tokenizer_lib
    from bert_jax.interop import convert, export, features
    from bert_jax.training import checkpoint

    fs, root = gcs_here, f"gs://{BUCKET}/tools"
    cfg = dict(name="bert", vocab_size=1000, emb_dim=16, num_layers=2, num_heads=2, head_dim=8,
               mlp_dim=32, max_len=32)
    params = nnx.to_pure_dict(nnx.state(models.create_model(cfg), nnx.Param))
    checkpoint.save_params(f"{root}/ckpt", 0, params, {"model": cfg})
    assert "vocab.txt" in tokenizer_lib.copy_tokenizer(vocab, f"{root}/ckpt")
    fs.pipe(f"{BUCKET}/tools/in.txt", b"Emma was happy.\nShe smiled. ||| He did not.\n")

    assert features.extract_features(f"{root}/ckpt", f"{root}/in.txt", f"{root}/out/f.jsonl",
                                     layers=(-1,), max_seq_length=32, batch_size=2) == 2
    rows = [json.loads(x) for x in fs.cat(f"{BUCKET}/tools/out/f.jsonl").decode().splitlines()]
    assert [r["features"][0]["token"] for r in rows] == ["[CLS]", "[CLS]"]

    report = export.export_hf(f"{root}/ckpt", f"{root}/hf")
    assert report["out"] == f"{root}/hf" and report["tokenizer"]
    assert listing(fs, f"{BUCKET}/tools/hf") == ["config.json", "model.safetensors",
                                                "special_tokens_map.json", "tokenizer.json",
                                                "tokenizer_config.json", "vocab.txt"]
    report = convert.convert_hf(f"{root}/hf", f"{root}/converted")
    assert report["source"] == f"hf:{root}/hf"  # named as given, not as its local copy
    assert {"checkpoints", "vocab.txt"} <= set(listing(fs, f"{BUCKET}/tools/converted"))
    assert checkpoint.read_config(f"{root}/converted")["model"]["vocab_size"] == 1000


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_network(monkeypatch):
    """GCS on a closed loopback port: (the port, the tries counted: connections of
    paths.check_reachable, HTTP requests of gcsfs with its retries)."""
    import aiohttp

    from bert_jax import paths

    port = _closed_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{port}")
    monkeypatch.setenv("FSSPEC_GS_TOKEN", "anon")
    tries = {"connect": 0, "request": 0}
    connect, request = paths.socket.create_connection, aiohttp.ClientSession._request

    def counted_connect(*args, **kwargs):
        tries["connect"] += 1
        return connect(*args, **kwargs)

    async def counted_request(*args, **kwargs):
        tries["request"] += 1
        return await request(*args, **kwargs)

    monkeypatch.setattr(paths.socket, "create_connection", counted_connect)
    monkeypatch.setattr(aiohttp.ClientSession, "_request", counted_request)
    # check_reachable's answers are per process and endpoint: the OS may give this test a port
    # an earlier one was refused on, which would then fail at once without a connection.
    monkeypatch.setattr(paths, "_REACHED", set())
    monkeypatch.setattr(paths, "_UNREACHED", {})
    return port, tries


@pytest.mark.parametrize("argv", [
    ["train", f"--config={CONFIG}", "--workdir={gs}", *SMALL],
    ["eval", "--workdir={gs}"],
    ["average", "--workdir={gs}", "--out={tmp}/avg"],
    ["translate", "--checkpoint={gs}", "--input=/dev/null", "--output={tmp}/out.txt"],
    ["plot", "--workdir={gs}"],
    ["vocab", "--input={tmp}/a.txt", "--size=100", "--out={gs}"],
    ["convert", "hf:{tmp}", "{gs}"],
], ids=lambda argv: argv[0])
def test_without_network_one_line_names_gcs_at_once(cli, no_network, monkeypatch, tmp_path, argv):
    # Storage that refuses connections (as the emulator on a closed port; real GCS without a
    # network fails its name lookup, or times out where packets are dropped): gcsfs would retry
    # each request for ~30 s with a traceback each time, then report a missing folder (convert
    # and vocab --out, before every gs:// path passed paths.check_reachable: 35-90 s, then a raw
    # aiohttp message). One connection is tried, and no request is made.
    port, tries = no_network
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")  # train, eval: the cache in the gs:// workdir
    (tmp_path / "a.txt").write_text("Emma was happy.\n")
    workdir = f"gs://{BUCKET}/run"
    code, _, err = cli([a.format(gs=workdir, tmp=tmp_path) for a in argv])
    assert code == 1 and tries == {"connect": 1, "request": 0}  # bounded: no retries at all
    assert err.splitlines() == [
        f"bert-jax {argv[0]}: error: cannot reach Google Cloud Storage (localhost:{port}) for {workdir}: "
        f"Connection refused; check this machine's network (and any firewall or proxy), then rerun"]


def test_an_unreachable_gs_compilation_cache_is_turned_off_at_once(cli, no_network, tmp_path):
    """A gs:// --compilation_cache without a network, for a local run: one line and the command
    goes on without it, after one connection (JAX would try the bucket at every program)."""
    import jax

    port, tries = no_network
    before = jax.config.jax_enable_compilation_cache
    try:
        code, _, err = cli(["translate", f"--checkpoint={tmp_path / 'none'}", "--input=/dev/null",
                            f"--output={tmp_path / 'out.txt'}", f"--compilation_cache=gs://{BUCKET}/jit"])
        assert not jax.config.jax_enable_compilation_cache
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
    assert code == 1 and tries == {"connect": 1, "request": 0}
    assert err.splitlines()[0] == (
        f"warning: the compilation cache gs://{BUCKET}/jit cannot be used (cannot reach Google Cloud "
        f"Storage (localhost:{port}) for gs://{BUCKET}/jit: Connection refused; check this machine's "
        "network (and any firewall or proxy), then rerun); running without it (every program "
        "compiles; --compilation_cache_required refuses instead)")
    assert "checkpoint" in err.splitlines()[1] and len(err.splitlines()) == 2, err  # it went on


def test_task_files_without_network_one_line_names_gcs(cli, no_network, tmp_path, wordpiece_vocab):
    """A local run whose fine-tuning files are on gs:// (data.data_dir) stops at once too, naming
    the data_dir as given."""
    port, tries = no_network
    code, _, err = cli(["train", "--config=configs/glue.py:mrpc,tiny", f"--workdir={tmp_path / 'run'}",
                        f"--config.data.data_dir=gs://{BUCKET}/glue",
                        f"--config.data.tokenizer={wordpiece_vocab.parent}"])
    assert code == 1 and tries == {"connect": 1, "request": 0}
    assert err.splitlines() == [
        f"bert-jax train: error: cannot reach Google Cloud Storage (localhost:{port}) for "
        f"gs://{BUCKET}/glue: Connection refused; check this machine's network (and any "
        "firewall or proxy), then rerun"]


def test_an_unanswered_connection_is_bounded_in_time(monkeypatch):
    from bert_jax import paths

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://storage.test:4443")
    answer = threading.Event()

    def unanswered(*args, **kwargs):  # a connection whose packets are dropped
        answer.wait(60)
        raise TimeoutError("timed out")

    monkeypatch.setattr(paths.socket, "create_connection", unanswered)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"\(storage.test:4443\) for gs://b/run: no answer in 0.5 s"):
        paths.check_reachable("gs://b/run", timeout=0.5)
    assert time.monotonic() - start < 30  # it did not wait for the connection (60 s)
    answer.set()
    paths.check_reachable("/a/local/folder")  # nothing to check


def test_gcsfs_request_errors_go_to_the_details_file(capsys):
    import logging

    from bert_jax import log

    log.divert_library_errors()
    try:
        raise ConnectionError("Cannot connect to host storage.googleapis.com:443")
    except ConnectionError:
        logging.getLogger("gcsfs").exception("_request out of retries on exception")
    err = capsys.readouterr().err
    assert "Traceback" not in err and "out of retries" not in err, err
    with open(log._NOISE.path, encoding="utf-8") as f:
        assert "_request out of retries" in f.read()


def _head(path, lines: int) -> bytes:
    """The first `lines` lines of a file, as they are (byte order mark, line endings)."""
    return b"".join(path.read_bytes().splitlines(keepends=True)[:lines])


@pytest.fixture(scope="module")
def glue_dir(gcs_here, shared_data):
    """gs://bucket/glue: the GLUE layout (MRPC/train.tsv, dev.tsv, test.tsv) with the first rows
    of the real files (MRPC's byte order mark and unbalanced quotes included)."""
    for name, lines in (("train.tsv", 41), ("dev.tsv", 17), ("test.tsv", 9)):
        gcs_here.pipe(f"{BUCKET}/glue/MRPC/{name}", _head(shared_data / "glue" / "MRPC" / name, lines))
    return f"gs://{BUCKET}/glue"


def test_task_files_on_gs_read_and_write_as_local_ones(glue_dir, vocab, gcs_here, shared_data, tmp_path):
    """The task readers and prediction writers give on gs:// what they give locally: GLUE
    through data.data_dir (and a --split file), CoNLL NER, SWAG and SQuAD; errors name the
    gs:// file as given."""
    from bert_jax import config as config_lib
    from bert_jax import tasks
    from bert_jax.tasks import glue, ner, squad, swag

    fs = gcs_here

    def local_copy(remote: str):  # the same bytes in a local file (its stem kept: example ids)
        local = tmp_path / remote.rsplit("/", 1)[0].replace("/", "_") / remote.rsplit("/", 1)[1]
        local.parent.mkdir(exist_ok=True)
        local.write_bytes(fs.cat(remote))
        return local

    def glue_config(data_dir):
        return config_lib.load(str(REPO / "configs" / "glue.py") + ":mrpc,tiny", [
            f"data.data_dir={data_dir}", f"data.tokenizer={vocab}", "model.vocab_size=1000"])

    config = glue_config(glue_dir)
    task = tasks.from_config(config_lib.resolve(config))
    assert str(task.path("train")) == f"{glue_dir}/MRPC/train.tsv"
    for split, n in (("train", 40), ("dev", 16), ("test", 8)):
        local = local_copy(f"{BUCKET}/glue/MRPC/{split}.tsv")
        assert task.examples(split) == glue.read_glue("mrpc", local) and len(task.examples(split)) == n
    assert task.examples(f"{glue_dir}/MRPC/dev.tsv") == task.examples("dev")  # --split <gs:// file>
    assert task.features("dev")["input_ids"].shape == (16, config.data.max_seq_length)
    # The leaderboard file, written straight into the bucket as it is written locally.
    outputs = {"logits": np.eye(2, dtype=np.float32)[np.arange(8) % 2]}
    [written] = task.write_predictions("test", outputs, f"gs://{BUCKET}/preds")
    [local] = task.write_predictions("test", outputs, tmp_path)
    assert str(written) == f"gs://{BUCKET}/preds/MRPC.tsv"
    assert fs.cat(f"{BUCKET}/preds/MRPC.tsv") == local.read_bytes()

    with pytest.raises(FileNotFoundError, match=f"glue train file not found: gs://{BUCKET}/nope/MRPC/"
                                                r"train.tsv; check data.data_dir"):
        tasks.from_config(config_lib.resolve(glue_config(f"gs://{BUCKET}/nope"))).examples("train")
    fs.pipe(f"{BUCKET}/bad/dev.tsv", b"index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(glue.GlueFormatError, match=f"gs://{BUCKET}/bad/dev.tsv:2: label column"):
        glue.read_glue("rte", f"gs://{BUCKET}/bad/dev.tsv")
    fs.pipe(f"{BUCKET}/bad/latin1.tsv", b"index\tsentence1\tsentence2\tlabel\n0\tcaf\xe9\tb\tentailment\n")
    with pytest.raises(ValueError, match=f"gs://{BUCKET}/bad/latin1.tsv:2: not UTF-8"):
        glue.read_glue("rte", f"gs://{BUCKET}/bad/latin1.tsv")

    conll = f"{BUCKET}/ner/valid.txt"
    fs.pipe(conll, _head(shared_data / "ner" / "conll2003" / "valid.txt", 80))
    sentences = ner.read_columns(f"gs://{conll}")
    assert sentences == ner.read_columns(local_copy(conll)) and len(sentences) > 3
    tags = [s.tags for s in sentences]
    ner.write_tags(f"gs://{BUCKET}/ner/out/tags.txt", sentences, tags)
    local = ner.write_tags(tmp_path / "tags.txt", sentences, tags)
    assert fs.cat(f"{BUCKET}/ner/out/tags.txt") == local.read_bytes()

    swag_file = shared_data / "fixtures" / "swag_sample.jsonl"
    fs.pipe(f"{BUCKET}/swag/{swag_file.name}", swag_file.read_bytes())
    assert swag.read_swag(f"gs://{BUCKET}/swag/{swag_file.name}") == swag.read_swag(swag_file)

    dev = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text())
    dev["data"] = dev["data"][:1]
    fs.pipe(f"{BUCKET}/squad/dev.json", json.dumps(dev).encode())
    questions = squad.read_squad(f"gs://{BUCKET}/squad/dev.json", is_training=False, version_2=False)
    assert questions == squad.read_squad(local_copy(f"{BUCKET}/squad/dev.json"), is_training=False,
                                         version_2=False)
    answers = {q.qas_id: q.answers[0] for q in questions}
    assert squad.evaluate(f"gs://{BUCKET}/squad/dev.json", answers)["exact_match"] == 100.0
    nbest = {k: [{"text": v, "probability": 1.0}] for k, v in answers.items()}
    out = squad.write_predictions(f"gs://{BUCKET}/squad/out", answers, nbest, {})
    assert str(out) == f"gs://{BUCKET}/squad/out"
    assert json.loads(fs.cat(f"{BUCKET}/squad/out/predictions.json")) == answers


@pytest.mark.slow  # ~35 s: three tiny runs, Orbax saving and restoring through the emulator
def test_finetune_from_gs_task_files_in_a_gs_workdir_then_init_from_it(glue_dir, vocab, gcs_here, cli,
                                                                       tmp_path):
    """The pod fine-tuning command: GLUE files, tokenizer and workdir on gs://; `eval` on the
    test split and on a gs:// file writes its predictions into the bucket; `average` into
    the bucket carries the tokenizer; a run with init_from=<the gs:// workdir> starts from it."""
    fs, root, workdir = gcs_here, f"{BUCKET}/mrpc", f"gs://{BUCKET}/mrpc"
    tiny = ["--config.model.vocab_size=1000", "--config.train.batch_size=8", "--config.train.steps=2",
            "--config.data.max_seq_length=32"]
    code, out, err = cli(["train", "--config=configs/glue.py:mrpc,tiny", f"--workdir={workdir}", *tiny,
                          f"--config.data.data_dir={glue_dir}", f"--config.data.tokenizer={vocab}"])
    assert code == 0, err[-3000:]
    summary = json.loads(out.splitlines()[-1])
    assert summary["step"] == 2 and {"eval/f1", "eval/accuracy"} <= set(summary["eval"]), summary
    assert {"checkpoints", "metrics.jsonl", "vocab.txt"} <= set(listing(fs, root))

    code, out, err = cli(["eval", f"--workdir={workdir}", "--split=test"])
    assert code == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == {"step": 2}  # unlabeled: predictions only
    rows = fs.cat(f"{root}/eval/test/step_2/MRPC.tsv").decode().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 1 + 8
    code, out, err = cli(["eval", f"--workdir={workdir}", f"--split={glue_dir}/MRPC/dev.tsv"])
    assert code == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])  # the dev file by its path: the run's own dev scores
    assert result["eval/accuracy"] == pytest.approx(summary["eval"]["eval/accuracy"])
    assert len(fs.cat(f"{root}/eval/dev/step_2/MRPC.tsv").decode().splitlines()) == 1 + 16

    code, out, err = cli(["average", f"--workdir={workdir}", "--last=1", f"--out=gs://{BUCKET}/mrpc_avg"])
    assert code == 0, err[-3000:]
    assert {"checkpoints", "vocab.txt"} <= set(listing(fs, f"{BUCKET}/mrpc_avg"))

    # Its tokenizer from the gs:// workdir too (no data.tokenizer).
    code, out, err = cli(["train", "--config=configs/glue.py:mrpc,tiny", f"--workdir={tmp_path / 'again'}",
                          *tiny, f"--config.data.data_dir={glue_dir}", f"--config.init_from={workdir}"])
    assert code == 0, err[-3000:]
    assert f"init_from {workdir}: " in out and "tensors loaded" in out, out[-3000:]
    assert (tmp_path / "again" / "vocab.txt").read_bytes() == fs.cat(f"{BUCKET}/vocab/vocab.txt")


def test_translate_input_reference_and_output_on_gs(vocab, gcs_here, cli, tmp_path):
    """`translate --input/--reference/--output gs://...` with a tiny (untrained) encoder-decoder."""
    from flax import nnx

    from bert_jax import config as config_lib
    from bert_jax import models
    from bert_jax.training import checkpoint
    from bert_jax.translation import bleu

    fs = gcs_here
    config = config_lib.load(str(REPO / "configs" / "multi30k.py"), [
        "model.num_layers=1", "model.num_decoder_layers=1", "model.emb_dim=16", "model.num_heads=2",
        "model.head_dim=8", "model.mlp_dim=32", "model.vocab_size=1000", "data.max_seq_length=16",
        "decode.max_extra=3", "decode.batch_size=2", f"data.tokenizer={vocab}"])
    params = nnx.to_pure_dict(nnx.state(models.create_model(config_lib.model_config(config)), nnx.Param))
    checkpoint.save_params(tmp_path / "mt", 0, params, config.to_dict())
    fs.pipe(f"{BUCKET}/mt/src.en", b"Emma was happy.\nShe smiled.\nHe did not.\n")
    fs.pipe(f"{BUCKET}/mt/ref.de", b"Emma war froh.\nSie l\xc3\xa4chelte.\nEr nicht.\n")
    code, out, err = cli(["translate", f"--checkpoint={tmp_path / 'mt'}", f"--input=gs://{BUCKET}/mt/src.en",
                          f"--output=gs://{BUCKET}/mt/out/hyp.de", f"--reference=gs://{BUCKET}/mt/ref.de"])
    assert code == 0, err[-3000:]
    hyps = fs.cat(f"{BUCKET}/mt/out/hyp.de").decode().split("\n")
    assert len(hyps) == 3 + 1 and hyps[-1] == ""  # one line per input, each ended
    report = json.loads(out.splitlines()[-1])
    assert report["output"] == f"gs://{BUCKET}/mt/out/hyp.de" and report["sentences"] == 3
    refs = ["Emma war froh.", "Sie lächelte.", "Er nicht."]
    assert report["sacrebleu"]["bleu"] == pytest.approx(bleu.corpus_bleu(hyps[:-1], refs)["bleu"])
