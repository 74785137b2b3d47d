"""Cloud TPU slices by the names users type (`v3-32`, `v4-32`, `v5p-64`, `v5litepod-16`,
`v6e-16`): chips, JAX devices, hosts, HBM and peak FLOP/s, and compile-only devices for them
(libtpu compiles for a topology on any Linux x86-64 machine, no TPU needed).

Naming: for v2, v3, v4 and v5p the number counts TensorCores (2 per chip); for v5e
(`v5litepod`) and v6e it counts chips. On v2/v3 each TensorCore is a JAX device with its own
HBM; v4 and v5p fuse a chip's two cores into one device ("megacore"). HBM per device is what
the compiler reports as available; peak FLOP/s are the bf16 figures Google publishes per chip
(the generations' facts: bert_jax/chips.py).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
import re

from bert_jax.chips import GENERATIONS, Generation, GiB

ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}
EXAMPLES = "v3-32, v4-32, v5p-64, v5litepod-16, v6e-16"
# The zones that have each generation (Cloud TPU docs, "TPU regions and zones", 2025). Google
# adds zones: one it lists that is missing here belongs in this table.
ZONES = {
    "v2": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a",
           "asia-east1-c"),
    "v3": ("us-central1-a", "us-central1-b", "us-central1-f", "europe-west4-a"),
    "v4": ("us-central2-b",),
    "v5p": ("us-central1-a", "us-east5-a", "us-east5-b", "us-east5-c", "us-south1-a",
            "europe-west4-b"),
    "v5e": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "us-west4-b", "us-east1-c",
            "us-east5-a", "us-east5-b", "us-east5-c", "europe-west4-b", "asia-southeast1-b"),
    "v6e": ("us-central1-b", "us-east1-d", "us-east4-a", "us-east4-b", "us-east5-a", "us-east5-b",
            "us-east5-c", "us-south1-a", "us-west1-c", "europe-west4-a", "asia-northeast1-b",
            "southamerica-west1-a"),
}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice (or `slices` identical ones joined by the data-center network)."""

    name: str  # as the user typed it, e.g. v4-32
    generation: str  # key of GENERATIONS
    shape: tuple[int, ...]  # chips along each torus dimension
    slices: int = 1

    @property
    def gen(self) -> Generation:
        return GENERATIONS[self.generation]

    @property
    def chips(self) -> int:
        return math.prod(self.shape) * self.slices

    @property
    def devices(self) -> int:
        return self.chips * self.gen.devices_per_chip

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        if math.prod(self.shape) < 4:  # a single-chip v5e/v6e
            return (*self.shape, 1, 1)[:3]
        if self.gen.dims == 2 and math.prod(self.shape) == 8:  # v5e/v6e-8: one host, 8 chips
            return (2, 4, 1)
        return (2, 2, 1)

    @property
    def hosts(self) -> int:
        return self.chips // math.prod(self.host_bounds)

    @property
    def label(self) -> str:
        return self.name if self.slices == 1 else f"{self.slices} x {self.name}"

    def describe(self) -> str:
        g = self.gen
        per = (f"{g.devices_per_chip} TensorCores per chip, each a device with "
               if g.devices_per_chip > 1 else "")
        return (f"{self.label}: {self.chips} chips ({'x'.join(map(str, self.shape))}"
                f"{' per slice' if self.slices > 1 else ''}), {self.devices} devices ({per}"
                f"{g.hbm_per_device / GiB:.2f} GiB HBM), {self.hosts} "
                f"host{'s' if self.hosts > 1 else ''}, peak "
                f"{g.peak_per_chip / 1e12:.0f} bf16 TFLOP/s per chip")


def parse(name: str, slices: int = 1) -> Slice:
    """The slice a user names, e.g. 'v4-32'; errors list the accepted forms."""
    m = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", name.strip().lower())
    if not m:
        raise ValueError(f"--topology={name!r}: expected a Cloud TPU name such as {EXAMPLES}")
    generation, number = ALIASES.get(m.group(1), m.group(1)), int(m.group(2))
    if generation not in GENERATIONS:
        raise ValueError(f"--topology={name!r}: unknown TPU generation {m.group(1)!r}; known: "
                         f"{', '.join([*GENERATIONS, *ALIASES])}")
    if slices < 1:
        raise ValueError(f"--slices={slices}: must be 1 or more")
    g = GENERATIONS[generation]
    chips = number // 2 if g.name_counts_cores else number
    shape = _torus(chips, g.dims)
    if shape is None or chips > g.max_chips or chips in g.missing or (g.name_counts_cores and number % 2):
        sizes = [c * (2 if g.name_counts_cores else 1) for c in _sizes(g)]
        raise ValueError(f"--topology={name!r}: no {generation} slice of that size; sizes: "
                         f"{', '.join(f'{m.group(1)}-{n}' for n in sizes)}")
    return Slice(name, generation, shape, slices)


def check_zone(zone: str, s: Slice, any_zone: bool = False) -> None:
    """`zone` is a zone name and, unless any_zone, one with slices of s's generation (ZONES);
    else an error naming the zones that have them."""
    if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z0-9]+", zone):
        raise ValueError(f"--zone={zone!r}: not a Cloud zone name (region-zone, e.g. us-central2-b)")
    known = ZONES[s.generation]
    if zone not in known and not any_zone:
        raise ValueError(f"--zone={zone}: no {s.generation} TPUs ({s.name}) there as far as "
                         f"bert_jax knows; {s.generation} zones: {', '.join(known)} (a zone "
                         "Google added since: pass --any_zone)")


def _torus(chips: int, dims: int) -> tuple[int, ...] | None:
    """The torus shape of a power-of-two slice: 2D 2x2, 2x4, 4x4, 4x8, ...; 3D 2x2x1,
    2x2x2, 2x2x4, 2x4x4, 4x4x4, ... (the shapes Cloud TPU allocates for these sizes)."""
    if chips < 1 or chips & (chips - 1):
        return None
    if dims == 2:
        if chips == 1:
            return (1, 1)
        if chips == 2:
            return None
        shape = [2, 2]
        while math.prod(shape) < chips:
            shape[0 if shape[0] < shape[1] else 1] *= 2
        return tuple(shape)
    if chips < 4:
        return None
    if chips == 4:
        return (2, 2, 1)
    shape = [2, 2, 2]
    while math.prod(shape) < chips:
        if shape[0] == shape[1] == shape[2]:
            shape[2] *= 2
        else:
            shape[next(i for i in range(2) if shape[i] < shape[i + 1])] *= 2
    return tuple(shape)


def _sizes(g: Generation) -> list[int]:
    """Chip counts of the slices of generation `g`."""
    return [2**i for i in range(20)
            if 2**i <= g.max_chips and 2**i not in g.missing and _torus(2**i, g.dims)]


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def on_tpu_vm() -> bool:
    """A TPU is attached to this machine (its device files exist)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_libtpu_off_tpu() -> None:
    """With libtpu installed on a machine without a TPU, every JAX start prints libtpu's
    failed search for a TPU (metadata server, worker hostnames). Telling it there is none
    keeps those lines away; on a TPU VM nothing is changed. Call before JAX initialises."""
    if on_tpu_vm() or not libtpu_installed():
        return
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")


def compile_only_devices(s: Slice) -> list:
    """JAX devices of slice `s` that programs can be compiled for (not run on)."""
    if not libtpu_installed():
        raise ValueError("compiling for a TPU slice needs libtpu (the TPU compiler, Linux "
                         "x86-64): pip install 'bert_jax[tpu]' (or pip install 'jax[tpu]')")
    quiet_libtpu_off_tpu()
    # Compiling touches no TPU: other processes using libtpu (a plan beside this one, or a
    # run on this TPU VM) are no reason to stop.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    g = s.gen
    wrap = (tuple(d >= 4 for d in s.shape) if g.dims == 3 and min(s.shape) >= 4
            else tuple(d == g.pod_side for d in s.shape) + (False,) * (3 - len(s.shape)))
    name = f"{g.topology}:{'x'.join(map(str, s.shape))}"
    try:
        topology = topologies.get_topology_desc(
            platform="tpu", topology_name=name,
            chip_config_name="megacore" if g.devices_per_chip == 1 and g.dims == 3 else "default",
            chips_per_host_bounds=s.host_bounds, num_slices=s.slices, wrap=wrap[:3])
    except Exception as e:  # noqa: BLE001 (libtpu's errors: version, lockfile, unknown topology)
        raise ValueError(f"libtpu could not describe {s.label} ({name}): "
                         f"{str(e).splitlines()[0]}") from None
    return list(topology.devices)
