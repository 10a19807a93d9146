"""Disjoint sets of whole physical cores (every hyperthread sibling of a core together,
no core shared between sets) from Linux sysfs and this process's affinity: one set for
the client, one per server.  A process pinned before exec passes the pinning on to
every process it spawns (taskset_argv, preexec).

Cores come in (package, lowest CPU id) order and only those whose every sibling this
process may run on count; core_sets takes the first ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")


class CoresError(RuntimeError):
    """The host's cores cannot be split as asked."""


class NoTopology(CoresError):
    def __init__(self, root: Path) -> None:
        super().__init__(
            f"no CPU topology under {root} (cpuN/topology/): run on Linux with sysfs mounted"
        )


class NotEnoughCores(CoresError):
    def __init__(self, wanted: int, n_sets: int, cores_each: int, found: int) -> None:
        super().__init__(
            f"{n_sets} sets of {cores_each} whole cores need {wanted} but only {found} are"
            " wholly in this process's affinity: ask for fewer or smaller sets, or a larger"
            " machine (or widen the affinity this process was started with)"
        )


def parse_list(text: str) -> list[int]:
    """CPU ids from the kernel's list form ("0-3,8,10-11")."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return sorted(cpus)


def cpu_list(cpus: Iterable[int]) -> str:
    """The comma list `taskset -c` and the kernel read: "0,1,4,5"."""
    return ",".join(str(c) for c in sorted(cpus))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def physical_cores(root: Path = SYSFS_CPU, allowed: Iterable[int] | None = None) -> list[list[int]]:
    """Each whole core's CPU ids (sorted), the cores in (package, lowest id) order; a core
    with a sibling outside `allowed` (default: os.sched_getaffinity(0)) is left out.
    Siblings are read from thread_siblings_list, else grouped by (package, core_id)."""
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    groups: dict[tuple[object, ...], set[int]] = {}
    package_of: dict[tuple[object, ...], int] = {}
    for entry in root.glob("cpu[0-9]*"):
        topology = entry / "topology"
        package = _read(topology / "physical_package_id")
        siblings = _read(topology / "thread_siblings_list")
        core_id = _read(topology / "core_id")
        if not re.fullmatch(r"cpu\d+", entry.name) or package is None:
            continue  # offline CPUs have no topology
        if siblings is not None:
            members = parse_list(siblings)
            key: tuple[object, ...] = ("siblings", *members)
        elif core_id is not None:
            members = []
            key = ("core", int(package), int(core_id))
        else:
            continue
        groups.setdefault(key, set()).update([int(entry.name[3:]), *members])
        package_of[key] = int(package)
    if not groups:
        raise NoTopology(root)
    cores = sorted((package_of[k], sorted(cpus)) for k, cpus in groups.items())
    return [cpus for _, cpus in cores if set(cpus) <= allowed]


def core_sets(
    n_sets: int,
    cores_each: int,
    root: Path = SYSFS_CPU,
    allowed: Iterable[int] | None = None,
) -> list[list[int]]:
    """n_sets disjoint sorted CPU-id lists of cores_each whole cores each."""
    cores = physical_cores(root, allowed)
    wanted = n_sets * cores_each
    if n_sets < 1 or cores_each < 1 or wanted > len(cores):
        raise NotEnoughCores(wanted, n_sets, cores_each, len(cores))
    return [
        sorted(cpu for core in cores[i * cores_each : (i + 1) * cores_each] for cpu in core)
        for i in range(n_sets)
    ]


def taskset_argv(cpus: Iterable[int]) -> list[str]:
    """The argv prefix that runs a command, and all it spawns, on cpus."""
    return ["taskset", "-c", cpu_list(cpus)]


def preexec(cpus: Iterable[int]) -> Callable[[], None]:
    """A subprocess preexec_fn that pins the child (and all it spawns) to cpus."""
    chosen = sorted(cpus)

    def pin() -> None:
        os.sched_setaffinity(0, chosen)

    return pin
