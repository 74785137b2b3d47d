"""What `bert-jax launch` checks before paying for capacity, and what its workers install.

Checks (here, before `gcloud ... create`; each failure is one line naming what to do):
- the repository URL is one the workers can reach (not a local path or file://), and
  `git ls-remote` there lists a branch or tag containing the commit they check out;
- the config file at that commit is the file here (committed, no uncommitted changes);
- the gs:// workdir is writable (a probe object written and deleted through epath).
A dry run touches no network: it runs the local checks and names the others.

Workers: the TPU VM images (tpu-ubuntu2204-base, v2-alpha-tpuv5, -tpuv5-lite, -tpuv6e) are
Ubuntu 22.04, whose python3 is 3.10; bert_jax needs PYTHON_MIN. The setup makes a virtualenv
with this machine's Python version (python3 where the image's is that version, otherwise an
interpreter that uv, installed by pip, finds or downloads) and installs `bert_jax[tpu]`
constrained to the versions installed here (`lock`): the jax, jaxlib and libtpu that `plan`
compiled with, and every other runtime dependency.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

from bert_jax import paths

log = logging.getLogger(__name__)

# The oldest Python bert_jax runs on: pyproject.toml's requires-python (a test keeps them equal).
PYTHON_MIN = (3, 11)
EXTRAS = ("tpu",)  # what the workers install: bert_jax[tpu]
LOCK_FILE = "bert_jax.lock"  # on each worker, beside the clone


class PreflightError(ValueError):
    """A launch would fail on the workers: refused before any capacity is requested."""


def default_python() -> str:
    """The workers' Python by default: this machine's major.minor, which the lock was made with."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_python(version: str) -> str:
    """`version` (e.g. "3.12") if bert_jax runs on it, else a usage error naming the minimum."""
    m = re.fullmatch(r"(\d+)\.(\d+)", version.strip())
    if not m:
        raise PreflightError(f"--python={version!r}: a Python version such as "
                             f"{PYTHON_MIN[0]}.{PYTHON_MIN[1]} or 3.12 (major.minor)")
    if (int(m.group(1)), int(m.group(2))) < PYTHON_MIN:
        raise PreflightError(f"--python={version}: bert_jax needs Python >= "
                             f"{PYTHON_MIN[0]}.{PYTHON_MIN[1]} (pyproject.toml requires-python)")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def python_setup(version: str) -> str:
    """Shell that leaves `.venv` made with Python `version` (idempotent: a virtualenv of that
    version is kept). The image's python3 is used when it is that version; otherwise uv, put in
    ~/.local/bin by pip (or by uv's installer where the image has no pip), provides it (an
    interpreter of that version on the image, or uv's managed build, downloaded)."""
    v = shlex.quote(version)
    minor = "cut -d' ' -f2 | cut -d. -f1,2"  # "Python 3.10.12" -> 3.10
    uv = "$HOME/.local/bin/uv"
    return "; ".join([
        f'if [ "$(.venv/bin/python --version 2>&1 | {minor})" != {v} ]; then rm -rf .venv; '
        f'if [ "$(python3 --version 2>&1 | {minor})" = {v} ]; then python3 -m venv .venv; '
        f"else echo \"python3 is $(python3 --version 2>&1); Python {version} from uv\"; "
        # pip's uv; an image without pip: uv's own installer, into the same folder
        f"[ -x {uv} ] || python3 -m pip install --quiet --user uv || curl -LsSf "
        f"https://astral.sh/uv/install.sh | env UV_UNMANAGED_INSTALL=$HOME/.local/bin sh; "
        f"{uv} venv --quiet --seed --python {v} .venv; fi; fi",
    ])


def lock(pyproject: Path, extras: tuple[str, ...] = EXTRAS) -> tuple[list[str], list[str]]:
    """(pins, notes): `name==version` of every installed distribution in the runtime closure of
    the project's dependencies with `extras` (test-only packages, torch, ... are not in it), and
    why any requirement is not pinned (not installed here, a local build, a local version)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads(pyproject.read_text())["project"]
    me = canonicalize_name(project["name"])
    optional = project.get("optional-dependencies", {})
    todo = [(r, ()) for r in project.get("dependencies", [])]
    todo += [(r, ()) for extra in extras for r in optional.get(extra, [])]
    pins, notes, seen, done, mine = {}, [], set(), set(), set(extras)
    while todo:
        line, wanted = todo.pop()
        req = Requirement(line)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *wanted)):
            continue
        name = canonicalize_name(req.name)
        if name == me:  # bert_jax[plot] inside an extra: that extra's requirements
            todo += [(r, ()) for extra in set(req.extras) - mine for r in optional.get(extra, [])]
            mine |= set(req.extras)
            continue
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            note = f"{req.name}: not installed here, left to pip"
            notes += [] if note in notes else [note]
            continue
        todo += [(r, tuple(req.extras)) for r in dist.requires or []]
        if name in done:  # reached again with other extras
            continue
        done.add(name)
        version, origin = dist.version, _direct_url(dist)
        if "+" in version:
            notes.append(f"{dist.metadata['Name']}: {version} is a local build, left to pip")
        elif origin.get("dir_info") is not None:
            notes.append(f"{dist.metadata['Name']}: installed from {origin.get('url')}, left to pip")
        else:
            pins[name] = f"{dist.metadata['Name']}=={version}"
    return sorted(pins.values(), key=str.lower), notes


def describe(python: str, pins: list[str]) -> str:
    """One line: what the workers get."""
    key = [p for p in pins if p.lower().startswith(("jax==", "jaxlib==", "libtpu=="))]
    return (f"workers: Python {python}, bert_jax[{','.join(EXTRAS)}] with {len(pins)} packages "
            f"pinned to this machine's versions ({', '.join(key) or 'no jax here'})")


def _direct_url(dist) -> dict:
    """PEP 610: how a distribution was installed when not from an index (a directory, a file)."""
    try:
        return json.loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        return {}


# -- checks before capacity is requested -------------------------------------------------------

def _git(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # No password prompt, no ssh host-key question: a check answers, it does not wait.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
    except FileNotFoundError:
        raise PreflightError("git is not installed here: launch checks the commit the workers "
                             "run with it") from None
    except subprocess.TimeoutExpired:
        raise PreflightError(f"`git {' '.join(args)}` did not answer in {timeout:.0f} s: check "
                             f"the network and the repository URL") from None


def local_remote(url: str) -> bool:
    """A path or file:// URL: only this machine can clone it (the workers cannot)."""
    if "://" in url:
        return url.split("://", 1)[0].lower() == "file"
    # git's scp-like syntax, host:path (a colon before any slash), is a remote
    return not re.match(r"[^/]+:", url)


def check_remote(root: Path, url: str, commit: str, dry_run: bool) -> str:
    """The full hash of `commit` (a commit of the checkout at `root`) after checking that the
    workers can clone it from `url`: a branch or tag there contains it (`git ls-remote`, not
    run in a dry run)."""
    if local_remote(url):
        raise PreflightError(f"--repo {url} is a path on this machine: the workers clone the "
                             f"repository, so give a URL they can reach (--repo "
                             f"https://github.com/YOU/bert_jax.git) where the commit is pushed")
    full = _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").stdout.strip()
    if not full:
        raise PreflightError(f"--commit {commit} is not a commit of the checkout at {root}: "
                             f"`git fetch` it, or name one of this checkout")
    if dry_run:
        log.info(f"dry run: a launch checks here that {url} has {full[:12]} (git ls-remote)")
        return full
    out = _git(root, "ls-remote", "--heads", "--tags", url)
    if out.returncode:
        said = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise PreflightError(f"cannot list {url} ({said}): check the URL, the network and "
                             f"your access; the workers clone it")
    tips = {line.split("\t", 1)[0] for line in out.stdout.splitlines() if "\t" in line}
    if full in tips or any(_git(root, "merge-base", "--is-ancestor", full, tip).returncode == 0
                           for tip in tips):
        return full
    raise PreflightError(f"commit {full[:12]} is on no branch or tag of {url}, so the workers "
                         f"cannot check it out: push it (git push origin HEAD) and launch again")


def check_config(root: Path, relpath: str, commit: str) -> None:
    """The config file at `commit` is the file here: the workers run the committed copy."""
    if _git(root, "cat-file", "-e", f"{commit}:{relpath}").returncode:
        raise PreflightError(f"{relpath} is not in commit {commit[:12]}: the workers run the "
                             f"committed config; commit it (and push) and launch again")
    if _git(root, "diff", "--quiet", commit, "--", relpath).returncode:
        raise PreflightError(f"{relpath} differs from its copy in commit {commit[:12]}, which "
                             f"the workers run: commit it (and push) and launch again")


def check_workdir(workdir: str, dry_run: bool, config: dict | None = None) -> None:
    """The workdir accepts writes and deletes (checkpoints are written and pruned there), and
    a checkpoint already there is one run config `config` (as JSON) resumes."""
    if dry_run:
        log.info(f"dry run: a launch checks here that {workdir} is writable (a probe object "
                 f"written and deleted)")
        return
    probe = paths.workdir_path(workdir) / f".launch_probe_{uuid.uuid4().hex[:8]}"
    try:
        if not paths.is_remote(workdir):  # (on gs:// a mkdir may create the bucket)
            probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("bert-jax launch: write check\n")
        probe.unlink()
    except Exception as e:  # noqa: BLE001 (gcsfs, google-auth and OS errors alike)
        said = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise PreflightError(f"cannot write to the workdir {workdir} ({type(e).__name__}: "
                             f"{said}): check the bucket exists and that your account (and the "
                             f"TPU VMs' service account) may write and delete objects there") from None
    if config is not None:  # (the workers would refuse it at their resume, on the slice)
        from bert_jax.training import checkpoint  # jax, orbax, grain: only for this check

        checkpoint.check_resumes(workdir, config)
