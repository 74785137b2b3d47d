"""Training with a gs:// workdir, end to end, against a GCS emulator served from this process
(localhost only; no network, no credentials): checkpoints, metrics.jsonl, TensorBoard events and
summary.json land in the bucket; a run that crashed while saving resumes from its last complete
gs:// checkpoint with identical losses; `bert-jax eval` and `bert-jax plot` read the bucket and
write there."""

import functools
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

import pytest
from conftest import REPO
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


@pytest.fixture(scope="module")
def gcs():
    """(gcsfs filesystem on the emulator, environment for `bert-jax` subprocesses using it)."""
    from gcp_storage_emulator.handlers import buckets
    from gcp_storage_emulator.storage import Storage

    storage = Storage(use_memory_fs=True)
    buckets.create_bucket(BUCKET, storage)
    httpd = server.HTTPServer(("localhost", 0), functools.partial(_emulator_handler(), storage))
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
               GOOGLE_AUTH_TOKEN_FOR_TESTING="test")  # tensorstore: no credential lookup
    fs = gcsfs_core.GCSFileSystem(endpoint_url=url, token="anon", skip_instance_cache=True)
    yield fs, env
    httpd.shutdown()
    httpd.server_close()
    thread.join()


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
def test_train_resume_and_eval_in_a_gs_workdir(gcs):
    fs, env = gcs
    root, workdir = f"{BUCKET}/run", f"gs://{BUCKET}/run"
    train = ["train", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL,
             "--config.train.steps=8", "--config.train.checkpoint_every=4"]
    bert_jax(env, *train)
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
    assert "commit_success.txt" in listing(fs, f"{root}/checkpoints/8")
    summary = json.loads(fs.cat(f"{root}/summary.json"))
    assert summary["step"] == 8 and not summary["preempted"]

    out = bert_jax(env, "eval", f"--config={CONFIG}", f"--workdir={workdir}", *SMALL, "--step=all")
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in results] == [4, 8]
    # The same parameters and validation batches as the run's own final evaluation.
    assert results[-1]["eval/loss"] == pytest.approx(summary["eval"]["eval/loss"], rel=1e-6)
    assert listing(fs, f"{root}/eval") == ["step_4.json", "step_8.json"]
    assert json.loads(fs.cat(f"{root}/eval/step_8.json")) == results[-1]

    # The run's curves, drawn from the bucket into it.
    plotted = json.loads(bert_jax(env, "plot", f"--workdir={workdir}").stdout.splitlines()[-1])
    assert plotted["figure"] == f"{workdir}/plots/metrics.png"
    assert listing(fs, f"{root}/plots") == ["metrics.csv", "metrics.png"]
    csv_rows = fs.cat(f"{root}/plots/metrics.csv").decode().splitlines()
    assert sum(",loss," in r for r in csv_rows) == 8


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv", [
    ["train", f"--config={CONFIG}", "--workdir={gs}", *SMALL],
    ["eval", "--workdir={gs}"],
    ["average", "--workdir={gs}", "--out={tmp}/avg"],
    ["translate", "--checkpoint={gs}", "--input=/dev/null", "--output={tmp}/out.txt"],
    ["plot", "--workdir={gs}"],
], ids=lambda argv: argv[0])
def test_without_network_one_line_names_gcs_at_once(cli, monkeypatch, tmp_path, argv):
    # Storage that refuses connections (as the emulator on a closed port; real GCS without a
    # network fails its name lookup, or times out where packets are dropped): gcsfs would retry
    # each request for ~30 s with a traceback each time, then report a missing folder.
    port = _closed_port()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{port}")
    monkeypatch.setenv("FSSPEC_GS_TOKEN", "anon")
    workdir = f"gs://{BUCKET}/run"
    start = time.monotonic()
    code, _, err = cli([a.format(gs=workdir, tmp=tmp_path) for a in argv])
    assert code == 1 and time.monotonic() - start < 20
    assert err.splitlines() == [
        f"bert-jax {argv[0]}: error: cannot reach Google Cloud Storage (localhost:{port}) for {workdir}: "
        f"Connection refused; check this machine's network (and any firewall or proxy), then rerun"]


def test_an_unanswered_connection_is_bounded_in_time(monkeypatch):
    from bert_jax import paths

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://storage.test:4443")
    monkeypatch.setattr(paths.socket, "create_connection", lambda *a, **k: time.sleep(30))
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"\(storage.test:4443\) for gs://b/run: no answer in 0.5 s"):
        paths.check_reachable("gs://b/run", timeout=0.5)
    assert time.monotonic() - start < 5
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
