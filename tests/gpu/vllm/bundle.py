#!/usr/bin/env python3
"""Trim the vLLM, FlashInfer and xgrammar wheels to what a Nemotron-H run on one H200 loads.

The H200 machine reaches no package registry, and a device call carries at
most 64 MiB, so tests/gpu/vllm/bundle-0.20.sh ships these wheels trimmed:

    python3 tests/gpu/vllm/bundle.py vllm FULL.whl OUT_DIR
    python3 tests/gpu/vllm/bundle.py flashinfer FULL.whl OUT_DIR
    python3 tests/gpu/vllm/bundle.py xgrammar FULL.whl OUT_DIR
    python3 tests/gpu/vllm/bundle.py calls REPO_BYTES FOLDER...

`vllm` writes OUT_DIR/<same wheel name> without the native parts such a run
(TRITON_ATTN attention, the FlashInfer SSU, no MoE) does not load, and takes
two shared objects out as xz streams, which the stage script puts back:

- vllm/_C.abi3.so -> c.so.xz, with the device code no sm_90 GPU can run
  zeroed (`prune_fatbin`): its cubins are compressed already, and xz alone
  leaves 73 of its 88 MB;
- vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so -> fa3.so.xz: on CUDA,
  vllm.v1.attention.backends.fa_utils imports vllm.vllm_flash_attn at module
  level, which raises unless FA2 or FA3 loads.

Dropped: FA2's .so and FA4's cute/, _moe_C (imported under
contextlib.suppress(ImportError)), third_party/deep_gemm/, _flashmla*.
`flashinfer` keeps FlashInfer's Python package, its C++ include trees, and of
data/csrc only the sources its Mamba SSU JIT compiles. `xgrammar` drops the
static library and C++ headers (lib/, include/) that only C++ code linking
against xgrammar reads; its Python package loads its bindings' .so alone. `calls` checks that each
staging folder, with the repository, fits one device call.
"""

from __future__ import annotations

import lzma
import os
import re
import struct
import sys
import zipfile
from collections import Counter

# --- vLLM -----------------------------------------------------------------

VLLM_DROP = re.compile(
    r"^vllm/(vllm_flash_attn/(cute/|_vllm_fa[23]_C)|_moe_C|third_party/deep_gemm/|_flashmla)"
)
C_SO = "vllm/_C.abi3.so"
FA3_SO = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
XZ_NAMES = {C_SO: "c.so.xz", FA3_SO: "fa3.so.xz"}
TARGET_SM = 90
"""The H200's compute capability, as fatbin entries name it."""

# --- CUDA fatbins (the layout nvcc writes into an ELF's .nv_fatbin) ---------

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, payload size
ENTRY_ARCH_OFFSET = 28  # u32: the sm (cubin) or compute (PTX) number, e.g. 90
KIND_PTX, KIND_CUBIN = 1, 2


class FatbinError(ValueError):
    """The shared object has no .nv_fatbin section, or one this parser does not
    read; rebuild without pruning (it will not fit one device call) or fix the parser."""


def _section(data: bytes, wanted: str) -> tuple[int, int]:
    """(offset, size) of an ELF64 little-endian file's section named `wanted`."""
    if data[:6] != b"\x7fELF\x02\x01":
        raise FatbinError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.index(b"\0", names + name)
        if data[names + name : end].decode() == wanted:
            return offset, size
    raise FatbinError(f"no {wanted} section")


def runs_on(kind: int, arch: int, sm: int = TARGET_SM) -> bool:
    """Whether the driver may pick this fatbin entry on an sm_`sm` GPU: a cubin
    of that sm (sm_90 and sm_90a alike), or PTX of a compute capability up to
    it (JIT-compiled where a kernel has no such cubin)."""
    return arch == sm if kind == KIND_CUBIN else kind == KIND_PTX and arch <= sm


def prune_fatbin(data: bytes, sm: int = TARGET_SM) -> tuple[bytes, Counter, Counter]:
    """`data` (an ELF shared object) with the payload of every fatbin entry that
    cannot run on sm_`sm` zeroed, headers and layout unchanged: the driver
    picks among entries by their headers, so it picks what it picked before.
    Returns the bytes and the payload bytes kept and zeroed per (kind, arch)."""
    offset, size = _section(data, ".nv_fatbin")
    out = bytearray(data)
    kept: Counter = Counter()
    zeroed: Counter = Counter()
    pos, end = offset, offset + size
    while pos + FATBIN_HEADER.size <= end:
        magic, _version, header_size, entries_size = FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # blobs are 8-byte aligned; padding between them
            continue
        entry, last = pos + header_size, pos + header_size + entries_size
        if last > end:
            raise FatbinError(f"a fatbin at {pos:#x} runs past the section")
        while entry < last:
            kind, _v, entry_header, payload = ENTRY_HEADER.unpack_from(data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + ENTRY_ARCH_OFFSET)
            if kind not in (KIND_PTX, KIND_CUBIN) or entry + entry_header + payload > last:
                raise FatbinError(f"unreadable fatbin entry at {entry:#x} (kind {kind})")
            body = entry + entry_header
            if runs_on(kind, arch, sm):
                kept[kind, arch] += payload
            else:
                out[body : body + payload] = bytes(payload)
                zeroed[kind, arch] += payload
            entry = body + payload
        pos = last
    if not kept:
        raise FatbinError(f"no fatbin entry runs on sm_{sm}")
    return bytes(out), kept, zeroed


def _describe(counts: Counter) -> str:
    kinds = {KIND_PTX: "compute", KIND_CUBIN: "sm"}
    return ", ".join(
        f"{kinds[kind]}_{arch} {size / 2**20:.1f} MiB"
        for (kind, arch), size in sorted(counts.items())
    )


def trim_vllm(src: str, out: str) -> str:
    os.makedirs(out, exist_ok=True)
    dst = os.path.join(out, os.path.basename(src))
    with (
        zipfile.ZipFile(src) as zin,
        zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout,
    ):
        for info in zin.infolist():
            name = info.filename
            if name in XZ_NAMES:
                data = zin.read(name)
                if name == C_SO:
                    data, kept, zeroed = prune_fatbin(data)
                    print(f"{name}: kept {_describe(kept)}; zeroed {_describe(zeroed)}")
                with open(os.path.join(out, XZ_NAMES[name]), "wb") as f:
                    f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
            elif not VLLM_DROP.match(name):
                zout.writestr(info, zin.read(name))
    return dst


# --- FlashInfer -----------------------------------------------------------

FLASHINFER_CSRC = re.compile(
    r"^flashinfer/data/csrc/[^/]*(mamba|selective_state_update|tvm_ffi_utils|pytorch_extension_utils)[^/]*$"
)
FLASHINFER_DROP = re.compile(r"^flashinfer/data/cutlass/(examples|python|test|tools|docs|media)/")


def _flashinfer_keeps(name: str) -> bool:
    if name.startswith("flashinfer/data/csrc/"):
        return bool(FLASHINFER_CSRC.match(name))
    return not FLASHINFER_DROP.match(name)


def trim_flashinfer(src: str, out: str) -> str:
    os.makedirs(out, exist_ok=True)
    dst = os.path.join(out, os.path.basename(src))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if _flashinfer_keeps(info.filename):
                zout.writestr(info, zin.read(info.filename))
    return dst


# --- xgrammar -------------------------------------------------------------

XGRAMMAR_DROP = re.compile(r"^xgrammar/(lib|include)/")


def trim_xgrammar(src: str, out: str) -> str:
    os.makedirs(out, exist_ok=True)
    dst = os.path.join(out, os.path.basename(src))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if not XGRAMMAR_DROP.match(info.filename):
                zout.writestr(info, zin.read(info.filename))
    return dst


# --- Device calls ---------------------------------------------------------

CALL_LIMIT = 64 * 2**20
"""What one device call carries: the folder it is given and the repository."""


class CallTooLarge(ValueError):
    """A staging folder and the repository exceed one device call."""


def folder_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _dirs, names in os.walk(path)
        for name in names
    )


def check_calls(repo_bytes: int, folders: list[str], limit: int = CALL_LIMIT) -> dict[str, int]:
    """Each folder's size with the repository's; raises CallTooLarge naming every
    folder that does not fit `limit`."""
    sizes = {folder: folder_size(folder) + repo_bytes for folder in folders}
    over = [f"{folder} ({size / 2**20:.1f} MiB)" for folder, size in sizes.items() if size > limit]
    if over:
        raise CallTooLarge(
            f"with the repository, {', '.join(over)} exceed a device call's "
            f"{limit / 2**20:.0f} MiB: move a wheel to another staging folder"
        )
    return sizes


def main(argv: list[str]) -> int:
    if argv[:1] == ["calls"] and len(argv) > 2:
        try:
            sizes = check_calls(int(argv[1]), argv[2:])
        except CallTooLarge as e:
            print(e, file=sys.stderr)
            return 1
        for folder, size in sizes.items():
            print(f"{folder}: {size / 2**20:.1f} MiB with the repository")
        return 0
    trims = {"vllm": trim_vllm, "flashinfer": trim_flashinfer, "xgrammar": trim_xgrammar}
    if len(argv) != 3 or argv[0] not in trims:
        print(
            f"usage: bundle.py {{{','.join(trims)}}} FULL.whl OUT_DIR"
            " | bundle.py calls REPO_BYTES FOLDER...",
            file=sys.stderr,
        )
        return 2
    dst = trims[argv[0]](argv[1], argv[2])
    print(dst, os.path.getsize(dst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
