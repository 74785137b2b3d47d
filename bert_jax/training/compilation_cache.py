"""JAX's persistent cache of compiled programs for a command (--compilation_cache): where it
lives, so that a restart loads its programs instead of compiling them again."""

from __future__ import annotations

import logging
import os
import socket
import uuid

# The cache of local runs: one per user, shared by every run, eval and translation of the
# machine (entries are keyed by the program, the JAX version, devices and flags).
LOCAL_COMPILATION_CACHE = "~/.cache/bert_jax/jit"
LOCAL_COMPILATION_CACHE_BYTES = 8 * 2**30  # least recently used entries go beyond this


def compilation_cache_dir(setting: str, command: str, workdir: str | None,
                          environ=os.environ) -> str | None:
    """Where JAX keeps compiled programs for `command` (None: nowhere) from --compilation_cache.
    auto: a JAX_COMPILATION_CACHE_DIR the user set; for train and eval with a gs:// workdir,
    <workdir>/compilation_cache (a pod's restart gets fresh VMs: their local disks are gone,
    the bucket is not, and every worker shares it); else LOCAL_COMPILATION_CACHE, shared by
    the machine's runs (reruns, sweep trials, eval and translate of one model), kept out of
    workdirs so they stay small to copy."""
    if setting == "off":
        return None
    if setting != "auto":
        return setting if "://" in setting else os.path.abspath(os.path.expanduser(setting))
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    if command in ("train", "eval") and workdir and workdir.startswith("gs://"):
        return workdir.rstrip("/") + "/compilation_cache"
    base = environ.get("XDG_CACHE_HOME")
    return (os.path.join(base, "bert_jax", "jit") if base
            else os.path.expanduser(LOCAL_COMPILATION_CACHE))


def unusable(path: str) -> str | None:
    """Why the cache folder `path` (local or gs://) cannot be used, or None: its storage
    answers (paths.check_reachable's deadline), the folder can be made, and a probe file in
    it written and deleted, as JAX will write its entries."""
    from bert_jax import paths

    try:
        folder = paths.path(path)
        folder.mkdir(parents=True, exist_ok=True)
        # hosts sharing a gs:// cache may have equal pids (containers): a name of its own
        probe = folder / f".write-check.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex}"
        probe.write_text("")
        probe.unlink(missing_ok=True)
    except Exception as e:  # noqa: BLE001 (OS errors: no network, permission, a file in the way,
        # a full disk; and gcsfs's own for a bucket that refuses)
        return getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return None


def setup_compilation_cache(setting: str, command: str, workdir: str | None,
                            required: bool = False) -> None:
    """Points JAX's persistent compilation cache at compilation_cache_dir (before anything
    compiles: JAX opens the cache at its first compile). What the user set through JAX's own
    environment variables (JAX_ENABLE_COMPILATION_CACHE, JAX_COMPILATION_CACHE_DIR,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS...) stands unless --compilation_cache says
    otherwise; programs compiled in under a second (JAX's threshold) are not stored.

    A cache that cannot be used (`unusable`) is refused before the command starts when
    `required` (--compilation_cache_required), else turned off with one warning line saying
    why: JAX would otherwise go on uncached behind a storage library's errors, and retry an
    unreachable gs:// cache at every program."""
    import jax

    path = compilation_cache_dir(setting, command, workdir)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    users_own = setting == "auto" and (os.environ.get("JAX_COMPILATION_CACHE_DIR")
                                       or not jax.config.jax_enable_compilation_cache)
    if users_own and not jax.config.jax_enable_compilation_cache:
        return  # turned off by the user's own JAX settings
    in_workdir = bool(workdir) and path.startswith(workdir.rstrip("/") + "/")
    if in_workdir:  # the workdir's own storage: without a network, the workdir's one line
        from bert_jax import paths

        paths.check_reachable(workdir)
    if (reason := unusable(path)) is not None:
        said = f"the compilation cache {path} cannot be used ({reason})"
        if required or in_workdir:  # the workdir's own storage: the run could not go on either
            raise OSError(f"{said}; fix it, or choose another with --compilation_cache=<dir> (or "
                          "off)" + ("" if in_workdir else ", or run without it: drop "
                                    "--compilation_cache_required"))
        logging.getLogger(__name__).warning(f"warning: {said}; running without it (every program compiles; "
                    "--compilation_cache_required refuses instead)")
        jax.config.update("jax_enable_compilation_cache", False)
        return
    if users_own:
        return  # the user's own JAX settings
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    if (setting == "auto" and "://" not in path
            and "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ):
        jax.config.update("jax_compilation_cache_max_size", LOCAL_COMPILATION_CACHE_BYTES)
