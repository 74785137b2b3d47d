"""`bert-jax launch`: a training run on a Cloud TPU VM slice, from plan to deleted capacity.

1. `plan` compiles the config for the slice here; a config that does not fit is refused.
2. The capacity is requested as a queued resource (on-demand, or `--spot`) and waited for:
   WAITING_FOR_RESOURCES / PROVISIONING are reported as they change, FAILED stops.
3. Every worker is set up, idempotently and with retries: the repository at a pinned commit,
   a virtualenv with this machine's Python (uv provides it where the image's python3 is
   another version) and `bert_jax[tpu]` at the versions installed here (bringup.py), a stale
   libtpu lockfile removed.
4. `bert-jax train` starts on every worker (one process per host); each worker's log is kept
   as `<workdir>/logs/worker_<i>.log` (copied there every minute) and worker 0's is streamed.
5. Preempted (the queued resource SUSPENDED, or its node gone): the capacity is requested
   again and training resumes from the latest checkpoint in the workdir, up to
   `--max_restarts` times.
6. The queued resource (and its node) is deleted at the end, on failure and on Ctrl-C,
   unless `--keep`. `--dry_run` prints every gcloud command without running any.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bert_jax import specs
from bert_jax.cloud import bringup, tpu

log = logging.getLogger(__name__)

# Software versions of the TPU VM per generation (Cloud TPU docs, "TPU VM images").
RUNTIME = {"v2": "tpu-ubuntu2204-base", "v3": "tpu-ubuntu2204-base", "v4": "tpu-ubuntu2204-base",
           "v5p": "v2-alpha-tpuv5", "v5e": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
WAITING = ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "CREATING")
PREEMPTED = ("SUSPENDING", "SUSPENDED", "PREEMPTED", "DELETING", "NOT_FOUND")


class LaunchError(ValueError):
    """The launch stopped (capacity failed, setup failed, training failed, too many restarts)."""


@dataclasses.dataclass
class Launch:
    name: str  # queued resource and node id
    zone: str
    topology: str  # e.g. v4-32
    workdir: str  # gs://... (shared by every worker; checkpoints make restarts resume)
    train_args: list[str]  # the `bert-jax train` flags after the workdir (--config, overrides)
    repo: str  # git URL the workers clone
    commit: str  # the commit they check out
    project: str | None = None
    runtime_version: str | None = None
    spot: bool = False
    keep: bool = False
    dry_run: bool = False
    max_restarts: int = 3
    poll_seconds: float = 30.0
    setup_retries: int = 3
    python: str = dataclasses.field(default_factory=bringup.default_python)  # workers' major.minor
    lock: tuple[str, ...] = ()  # name==version pins the workers install with (bringup.lock)


def check_flags(name: str, zone: str, topology: str, max_restarts: int,
                poll_seconds: float, any_zone: bool = False,
                runtime_version: str | None = None) -> None:
    """The flags gcloud or the wait loop would reject or misuse, checked before anything runs
    (a dry run included)."""
    # TPU VM software versions: lowercase letters, digits, dots and hyphens (tpu-ubuntu2204-base,
    # v2-alpha-tpuv6e, tpu-vm-tf-2.16.1-pjrt); anything else fails only when the slice is queued.
    if runtime_version is not None and not re.fullmatch(r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?",
                                                        runtime_version):
        raise ValueError(f"--runtime_version={runtime_version!r}: a TPU VM software version is "
                         f"lowercase letters, digits, dots and hyphens, e.g. "
                         f"{RUNTIME['v5p']} (`gcloud compute tpus versions list` lists them)")
    # Cloud TPU names (node and queued resource ids), as the API's error states them.
    if not re.fullmatch(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", name):
        raise ValueError(f"--name={name!r}: a Cloud TPU name is 1-63 lowercase letters, "
                         "digits and hyphens, starting with a letter and not ending with a "
                         "hyphen, e.g. bert-base-1")
    tpu.check_zone(zone, tpu.parse(topology), any_zone)
    if max_restarts < 0:
        raise ValueError(f"--max_restarts={max_restarts}: the re-requests after "
                         "preemptions, >= 0 (0: stop at the first)")
    if not (math.isfinite(poll_seconds) and poll_seconds > 0):
        raise ValueError(f"--poll_seconds={poll_seconds}: seconds between state checks "
                         "of the queued resource, > 0 (default 30)")


def _path_keys(init_from: str, keys) -> dict[str, str]:
    """The paths the workers read, by config key: init_from and the data section's (`keys`)
    files, folders and tokenizer (comma-separated globs one by one)."""
    out = {"init_from": init_from} if init_from else {}
    for f in dataclasses.fields(keys):
        if f.name.endswith(("_files", "_file", "_dir")) or f.name == "tokenizer":
            for i, value in enumerate(v for v in str(getattr(keys, f.name)).split(",") if v.strip()):
                out[f"data.{f.name}" + (f"[{i}]" if i else "")] = value.strip()
    return out


def check_worker_paths(config, root: Path) -> None:
    """What the slice's workers read must be there for them: gs:// paths, or paths inside the
    repository they clone (relative to it); a file on this machine's disk is refused, as is a
    fine-tuning run with no folder for its files or a pretraining run whose data keys train
    would refuse (sources' check_named), before anything is rented."""
    from bert_jax.data import sources

    data = specs.data(config.data)
    if data.finetuning and data.source == "files" and not (data.keys.data_dir or data.keys.train_file):
        raise ValueError("data.data_dir is empty: the workers read the task's files from it; set "
                         "--config.data.data_dir=gs://<bucket>/<folder with the task's files>")
    for key, value in _path_keys(config.init_from, data.keys).items():
        if value.startswith("gs://"):
            continue
        inside = (root / value).resolve()
        if Path(value).is_absolute() or not inside.is_relative_to(root.resolve()):
            raise ValueError(f"{key}={value}: the slice's workers cannot read this machine's disk; "
                             "copy it to gs:// (gcloud storage cp -r) and give that path, or keep it "
                             "inside the repository (committed) and give it relative to the repository")
    if not data.finetuning:  # train's check of the keys naming its data (data.tokenizer, files)
        sources.get(data.source).check_named(data.keys)


def as_on_workers(config, root: Path):
    """`config` with an init_from inside the repository (relative to it, as the workers read it)
    as its path under `root`, for reading it here."""
    if not config.init_from or config.init_from.startswith("gs://"):
        return config
    config = config.copy_and_resolve_references()
    config.init_from = str(root / config.init_from)
    return config


class Gcloud:
    """Runs (or, in a dry run, only prints) gcloud commands; every command is logged."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run

    def __call__(self, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
        argv = ["gcloud", *args]
        log.info("+ " + shlex.join(argv))
        if self.dry_run:
            return subprocess.CompletedProcess(argv, 0, "ACTIVE\n" if capture else "", "")
        try:
            return subprocess.run(argv, text=True, capture_output=capture, check=False)
        except FileNotFoundError:
            raise LaunchError("gcloud is not installed or not on PATH: install the Google Cloud "
                              "CLI (https://cloud.google.com/sdk) and run `gcloud auth login`") from None


def _where(launch: Launch) -> list[str]:
    return [f"--zone={launch.zone}", *([f"--project={launch.project}"] if launch.project else [])]


def setup_script(launch: Launch) -> str:
    """Shell run on every worker before training: safe to run again (restarts, retries)."""
    repo, commit = shlex.quote(launch.repo), shlex.quote(launch.commit)
    lock = bringup.LOCK_FILE
    return "; ".join([
        "set -e",
        # the versions of the machine that planned the run, as pip constraints
        f"printf '%s\\n' {shlex.join(launch.lock)} > {lock}" if launch.lock else f": > {lock}",
        f"[ -d bert_jax/.git ] || git clone --quiet {repo} bert_jax",
        "cd bert_jax",
        f"git fetch --quiet origin || true; git checkout --quiet --force {commit}",
        bringup.python_setup(launch.python),
        ".venv/bin/pip install --quiet --upgrade pip",
        f".venv/bin/pip install --quiet -c ../{lock} -e '.[{','.join(bringup.EXTRAS)}]'",
        # a run killed by preemption or Ctrl-C leaves libtpu's lockfile behind
        "sudo rm -f /tmp/libtpu_lockfile 2>/dev/null || rm -f /tmp/libtpu_lockfile",
    ])


def train_script(launch: Launch) -> str:
    """Shell run on every worker: `bert-jax train`, its log kept in <workdir>/logs/ and, on
    worker 0, printed (gcloud shows it here)."""
    train = shlex.join([".venv/bin/bert-jax", "train", "--workdir", launch.workdir,
                        *launch.train_args])
    logs = f"{launch.workdir.rstrip('/')}/logs"
    worker = ("W=$(curl -sf -H Metadata-Flavor:Google http://metadata.google.internal/"
              "computeMetadata/v1/instance/attributes/agent-worker-number || echo 0)")
    if launch.workdir.startswith("gs://"):
        keep = f"gcloud storage cp --quiet $LOG {shlex.quote(logs)}/worker_$W.log"
    else:
        keep = f"mkdir -p {shlex.quote(logs)} && cp $LOG {shlex.quote(logs)}/worker_$W.log"
    return "; ".join([
        "cd bert_jax", worker, "LOG=/tmp/bert_jax_worker_$W.log",
        f"(while sleep 60; do {keep} >/dev/null 2>&1; done) & SYNC=$!",
        f'if [ "$W" = 0 ]; then {train} 2>&1 | tee $LOG; RC=${{PIPESTATUS[0]}}; '
        f"else {train} > $LOG 2>&1; RC=$?; fi",
        f"kill $SYNC; {keep}; exit $RC",
    ])


def state(gcloud: Gcloud, launch: Launch) -> str:
    """The queued resource's state (ACTIVE, WAITING_FOR_RESOURCES, ...; NOT_FOUND if gone)."""
    out = gcloud("compute", "tpus", "queued-resources", "describe", launch.name, *_where(launch),
                 "--format=value(state.state)", capture=True)
    return out.stdout.strip().upper() if out.returncode == 0 and out.stdout.strip() else "NOT_FOUND"


def request(gcloud: Gcloud, launch: Launch) -> None:
    """Queues the capacity and waits until it is ACTIVE (a FAILED request is an error)."""
    generation = tpu.parse(launch.topology).generation
    out = gcloud("compute", "tpus", "queued-resources", "create", launch.name,
                 f"--node-id={launch.name}", *_where(launch),
                 f"--accelerator-type={launch.topology}",
                 f"--runtime-version={launch.runtime_version or RUNTIME[generation]}",
                 *(["--spot"] if launch.spot else []))
    if out.returncode:
        raise LaunchError(f"could not queue {launch.topology} {launch.name!r} in {launch.zone} "
                          f"(gcloud exit {out.returncode}; its message is above)")
    last = None
    while True:
        now = state(gcloud, launch)
        if now != last:
            log.info(f"queued resource {launch.name}: {now}")
            last = now
        if now == "ACTIVE":
            return
        if now == "FAILED":
            raise LaunchError(f"queued resource {launch.name} FAILED (no capacity granted; "
                              f"`gcloud compute tpus queued-resources describe {launch.name} "
                              f"--zone={launch.zone}` says why)")
        if now not in WAITING:
            raise LaunchError(f"queued resource {launch.name} is {now} while waiting for it")
        time.sleep(launch.poll_seconds)


def ssh_all(gcloud: Gcloud, launch: Launch, command: str) -> int:
    return gcloud("compute", "tpus", "tpu-vm", "ssh", launch.name, *_where(launch),
                  "--worker=all", f"--command={command}").returncode


def setup(gcloud: Gcloud, launch: Launch) -> None:
    for attempt in range(1, launch.setup_retries + 1):
        if ssh_all(gcloud, launch, setup_script(launch)) == 0:
            return
        log.warning(f"warning: setting up the workers failed (attempt {attempt} of "
                    f"{launch.setup_retries})")
        time.sleep(launch.poll_seconds * attempt)
    raise LaunchError(f"could not set up the workers of {launch.name} after "
                      f"{launch.setup_retries} attempts (repository {launch.repo} at "
                      f"{launch.commit}; the messages are above)")


def delete(gcloud: Gcloud, launch: Launch) -> None:
    gcloud("compute", "tpus", "queued-resources", "delete", launch.name, *_where(launch),
           "--force", "--quiet")


def run(launch: Launch) -> dict:
    """Runs the launch to the end; returns {"restarts": n}. The capacity is deleted at the
    end (unless launch.keep) whatever happens."""
    gcloud = Gcloud(launch.dry_run)
    restarts = 0
    try:
        while True:
            request(gcloud, launch)
            setup(gcloud, launch)
            code = ssh_all(gcloud, launch, train_script(launch))
            if code == 0:
                log.info(f"training finished; logs in {launch.workdir.rstrip('/')}/logs/")
                found = goodput_summary(gcloud, launch)
                return {"restarts": restarts, **({"goodput": found} if found else {})}
            now = state(gcloud, launch)
            if now not in PREEMPTED:
                raise LaunchError(f"training failed on {launch.name} (exit {code}, slice {now}); "
                                  f"worker logs: {launch.workdir.rstrip('/')}/logs/")
            restarts += 1
            if restarts > launch.max_restarts:
                raise LaunchError(f"{launch.name} was preempted {restarts} times "
                                  f"(--max_restarts={launch.max_restarts}); rerun the same "
                                  f"command to go on from the latest checkpoint")
            log.warning(f"warning: {launch.name} preempted ({now}); requesting it again "
                        f"(restart {restarts} of {launch.max_restarts}), training resumes from "
                        f"the latest checkpoint in {launch.workdir}")
            delete(gcloud, launch)
    finally:
        if launch.keep:
            log.info(f"--keep: {launch.name} is kept; delete it with `gcloud compute tpus "
                     f"queued-resources delete {launch.name} --zone={launch.zone} --force`")
        else:
            delete(gcloud, launch)


def git_head(path: str = ".") -> tuple[str, str, bool]:
    """(origin URL, HEAD commit, working tree has uncommitted changes) of the checkout here."""
    def git(*args):
        return subprocess.run(["git", "-C", path, *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    return git("remote", "get-url", "origin"), git("rev-parse", "HEAD"), bool(git("status", "--porcelain"))


class NoSource(ValueError):
    """No --repo/--commit, and no git checkout to take them from (a usage error)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """What the workers run: the repository's config file at a commit."""

    config: str  # their --config: the file's path inside the repository, with its :arg
    repo: str  # git URL they clone
    commit: str
    placeholders: bool  # a dry run without git: REPO_URL/COMMIT shown, neither checked


def source(root: Path, config: str, repo: str | None, commit: str | None, dry_run: bool) -> Source:
    """The workers' source from --config, --repo and --commit (default: the checkout's origin and
    HEAD); warns on stderr where the workers will run something else than the files here."""
    origin, head, dirty = git_head(str(root))
    path, colon, arg = config.partition(":")
    try:  # the workers run the repository's copy of the config file
        worker_config = str(Path(path).resolve().relative_to(root)) + colon + arg
    except ValueError:
        raise ValueError(f"--config={config}: the workers have only the repository ({root} at the "
                         f"commit they run); put the config file in it and commit it") from None
    given_commit = commit
    repo, commit = repo or origin, commit or head
    placeholders = (not repo or not commit) and dry_run
    if placeholders:
        print("warning: no --repo/--commit, and no git origin/HEAD here to take them from: the dry "
              "run shows REPO_URL/COMMIT and checks neither them nor the config file", file=sys.stderr)
        repo, commit = repo or "REPO_URL", commit or "COMMIT"
    if not repo or not commit:
        raise NoSource("launch needs --repo and --commit (no git checkout here to take them from)")
    if dirty and not given_commit:
        print(f"warning: uncommitted changes here are not on the workers, which run {commit}",
              file=sys.stderr)
    return Source(worker_config, repo, commit, placeholders)


def check_source(root: Path, src: Source, dry_run: bool) -> Source:
    """The source with its commit's full hash, after checking the workers can clone it and that
    it holds the config file as it is here (nothing to check for placeholders)."""
    if src.placeholders:
        return src
    commit = bringup.check_remote(root, src.repo, src.commit, dry_run)
    bringup.check_config(root, src.config.partition(":")[0], commit)
    return dataclasses.replace(src, commit=commit)


def goodput_summary(gcloud: Gcloud, launch: Launch) -> dict | None:
    """The run's goodput (training/goodput.py: kept train-step time / wall time), in all and
    per attempt, from <workdir>/goodput.json (read with gcloud, as everything here); None
    where there is none to read."""
    from bert_jax.training import goodput

    if launch.dry_run:
        return None
    out = gcloud("storage", "cat", f"{launch.workdir.rstrip('/')}/{goodput.FILE}", capture=True)
    try:
        found = goodput.summarize(json.loads(out.stdout)) if out.returncode == 0 else None
    except ValueError:
        found = None
    if found is None:
        log.warning(f"warning: no goodput: {launch.workdir.rstrip('/')}/{goodput.FILE} could not "
                    "be read")
        return None
    log.info(f"goodput {100 * found['goodput']:.1f}% over {len(found['attempts'])} run(s): "
             + "; ".join(f"steps {a['steps']} {100 * a['goodput']:.1f}%" for a in found["attempts"]))
    return found
