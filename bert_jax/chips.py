"""Accelerator facts, stated once: the Cloud TPU generations (devices per chip, HBM, peak bf16
FLOP/s, torus shape; cloud/tpu.py builds slices from them) and the published dense bf16 peak of
each accelerator by the `device_kind` JAX reports (training/metrics.py: MFU).

On v2/v3 each of a chip's two TensorCores is a JAX device with its own HBM; v4 and v5p fuse a
chip's two cores into one device ("megacore"). HBM per device is what the compiler reports as
available; peak FLOP/s and HBM bandwidth are the figures Google publishes per chip (Cloud TPU
documentation, "TPU versions": v4 1,200 GB/s, v5e 819, v5p 2,765, v6e 1,640; v2 and v3 from
Jouppi et al., "A Domain-Specific Supercomputer for Training Deep Neural Networks", CACM 2020:
700 and 900 GB/s), which `plan` turns into roofline times. NVIDIA's headline figures
assume 2:4 sparsity; the dense number is half of them.
"""

from __future__ import annotations

import dataclasses

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Generation:
    topology: str  # the name libtpu knows the generation by
    devices_per_chip: int
    hbm_per_device: float  # bytes, as the compiler reports it available
    peak_per_chip: float  # bf16 FLOP/s
    dims: int  # 2D or 3D torus
    name_counts_cores: bool  # v3-32 is 32 TensorCores (16 chips); v5litepod-16 is 16 chips
    max_chips: int  # a full pod
    pod_side: int  # a 2D dimension of this length wraps around (full pod side)
    missing: tuple[int, ...] = ()  # chip counts no slice has (v3: 1 and 8; v3-8 is 4 chips)
    device_kinds: tuple[str, ...] = ()  # lowercase device_kind names its devices report
    hbm_bandwidth: float = 0.0  # bytes/s per chip
    # splash attention's tiles when model.attention_block_size=0 (models/kernels/splash.py):
    # MaxText's default (sa_block_* = 512 in its base.yml) on v4 and later, 1,024 on v5p, where
    # it trained faster than 512 (AI-Hypercomputer/maxtext PR 4929: 513 against 423 tokens/s a
    # chip at 1M tokens); v2 and v3 keep the kernel's 128 (nothing reported for them).
    splash_block: int = 128

    @property
    def peak_per_device(self) -> float:
        return self.peak_per_chip / self.devices_per_chip

    @property
    def bandwidth_per_device(self) -> float:
        return self.hbm_bandwidth / self.devices_per_chip


GENERATIONS = {
    "v2": Generation("v2", 2, 7.48 * GiB, 45e12, 2, True, 256, 16, (1, 8), ("tpu v2",), 700e9),
    "v3": Generation("v3", 2, 15.48 * GiB, 123e12, 2, True, 1024, 32, (1, 8), ("tpu v3",), 900e9),
    "v4": Generation("v4", 1, 30.75 * GiB, 275e12, 3, True, 4096, 0, (), ("tpu v4",), 1200e9, 512),
    # v5p reports "TPU v5" or "TPU v5p"; v5e "TPU v5 lite" (the longer name wins: peak_flops)
    "v5p": Generation("v5", 1, 95.74 * GiB, 459e12, 3, True, 8192, 0, (), ("tpu v5",), 2765e9, 1024),
    "v5e": Generation("v5e", 1, 15.75 * GiB, 197e12, 2, False, 256, 16, (), ("tpu v5 lite", "tpu v5e"),
                      819e9, 512),
    "v6e": Generation("v6e", 1, 31.25 * GiB, 918e12, 2, False, 256, 16, (), ("tpu v6 lite", "tpu v6e"),
                      1640e9, 512),
}

# A TensorCore's scalar memory, where splash keeps its mask info (the compiler: "would exceed
# memory (size=1048576)" in space=smem, v5p, AI-Hypercomputer/maxtext PR 4929); assumed the same
# on every generation.
SMEM_BYTES = 2**20

# (lowercase device_kind name, dense bf16 FLOP/s per GPU, source)
GPUS = (
    ("a100", 312e12, "NVIDIA A100 datasheet, bf16 dense"),  # 624 sparse; SXM and PCIe alike
    ("h100 pcie", 756e12, "NVIDIA H100 PCIe datasheet, bf16 dense"),  # 1,513 sparse
    ("h100 nvl", 835e12, "NVIDIA H100 NVL datasheet, bf16 dense"),  # 1,671 sparse
    ("h100", 989e12, "NVIDIA H100 SXM datasheet, bf16 dense"),  # 1,979 sparse
    ("h200 nvl", 835e12, "NVIDIA H200 NVL datasheet, bf16 dense"),  # 1,671 sparse
    ("h200", 989e12, "NVIDIA H200 SXM datasheet, bf16 dense"),  # 1,979 sparse; GH200 matches: same GPU
    ("b200", 2250e12, "NVIDIA HGX B200 datasheet, bf16 dense"),  # 4.5 PFLOP/s sparse per GPU
)


def _peaks() -> list[tuple[str, float, str]]:
    tpus = [(kind, g.peak_per_device, f"Cloud TPU {name} spec, bf16"
             + (f", per core ({g.devices_per_chip} devices a chip)" if g.devices_per_chip > 1 else ""))
            for name, g in GENERATIONS.items() for kind in g.device_kinds]
    return tpus + list(GPUS)


def peak_flops(device_kind: str) -> tuple[float, str] | None:
    """(peak dense bf16 FLOP/s of one device of `device_kind`, its source), or None for a kind
    no spec sheet here covers (CPUs, unlisted accelerators). The longest matching name wins
    ("tpu v5 lite" over "tpu v5", "h100 pcie" over "h100")."""
    kind = device_kind.lower()
    found = [p for p in _peaks() if p[0] in kind]
    if not found:
        return None
    _, flops, source = max(found, key=lambda p: len(p[0]))
    return flops, source


def generation(device_kind: str) -> Generation | None:
    """The TPU generation of a device_kind ("TPU v5 lite"), the longest matching name winning;
    None for any other device."""
    kind = device_kind.lower()
    found = [(name, g) for g in GENERATIONS.values() for name in g.device_kinds if name in kind]
    return max(found, key=lambda f: len(f[0]))[1] if found else None
