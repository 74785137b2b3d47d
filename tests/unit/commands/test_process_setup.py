"""commands.setup_process's patience for simulated CPU devices: XLA's CPU collectives abort a
process whose device threads do not all reach a collective in time (after a warning phase, a
termination timeout of 40 s), which the suite's 8 simulated devices on a loaded 2-core
machine can exceed; a bert_jax process raises that limit. Child processes: XLA reads
XLA_FLAGS once, when JAX creates its CPU client."""

import os
import subprocess
import sys

import pytest
from helpers import REPO

from bert_jax import commands

# Device 0's thread reaches an all-gather 3 s after the other seven (a host callback sleeping),
# in a process set up as bert_jax's are, with the limit setup_process gives (argv[1]).
LATE = """import sys, time
from bert_jax import commands
commands.SIMULATED_COLLECTIVE_TIMEOUT_S = int(sys.argv[1])
commands.setup_process()
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
def late(x):
    if x[0] == 0:
        time.sleep(3)
    return x
def gather(x):
    x = jax.pure_callback(late, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return jax.lax.all_gather(x, "d", tiled=True)
step = jax.jit(jax.shard_map(gather, mesh=mesh, in_specs=P("d"), out_specs=P(), check_vma=False))
print("gathered", float(step(jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))).sum()))
"""


def _late(limit: int) -> subprocess.CompletedProcess:
    # (the warning phase before the termination timeout shortened to 1 s, so that a limit of 1 s
    # shows within the 3 s)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8 "
               "--xla_cpu_collective_call_warn_stuck_timeout_seconds=1 --xla_backend_optimization_level=0")
    return subprocess.run([sys.executable, "-c", LATE, str(limit)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_late_device_aborts_under_a_short_limit_and_not_under_bert_jaxs():
    short = _late(1)
    assert short.returncode == -6, short.stderr[-2000:]  # SIGABRT, as the suite's crashed workers
    assert "Termination timeout for `all gather" in short.stderr and "of 1 seconds" in short.stderr
    shipped = _late(commands.SIMULATED_COLLECTIVE_TIMEOUT_S)
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    assert shipped.stdout.split() == ["gathered", "28.0"]


@pytest.mark.parametrize("given, want", [
    ("--xla_force_host_platform_device_count=8",
     "--xla_force_host_platform_device_count=8 --xla_cpu_collective_call_terminate_timeout_seconds=600"),
    # the user's own limit is kept; without simulated devices nothing is added
    ("--xla_force_host_platform_device_count=4 --xla_cpu_collective_call_terminate_timeout_seconds=5",
     "--xla_force_host_platform_device_count=4 --xla_cpu_collective_call_terminate_timeout_seconds=5"),
    ("--xla_backend_optimization_level=0", "--xla_backend_optimization_level=0"),
    (None, None),
])
def test_the_limit_is_raised_only_for_simulated_devices_and_never_over_the_users(monkeypatch, given,
                                                                                  want):
    if given is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", given)
    commands.patient_simulated_devices()
    assert os.environ.get("XLA_FLAGS") == want
    commands.patient_simulated_devices()  # twice: no second flag
    assert os.environ.get("XLA_FLAGS") == want
