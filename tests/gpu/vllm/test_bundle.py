"""bundle.py's trimming, on small files laid out as nvcc and the wheels lay them out (no GPU)."""

from __future__ import annotations

import importlib.util
import lzma
import struct
import zipfile
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("bundle", Path(__file__).with_name("bundle.py"))
assert _SPEC is not None and _SPEC.loader is not None
bundle = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bundle)

PTX, CUBIN = bundle.KIND_PTX, bundle.KIND_CUBIN
ENTRY_HEADER_SIZE = 64


def fatbin_entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = bytearray(ENTRY_HEADER_SIZE)
    bundle.ENTRY_HEADER.pack_into(header, 0, kind, 0x101, ENTRY_HEADER_SIZE, len(payload))
    struct.pack_into("<I", header, bundle.ENTRY_ARCH_OFFSET, arch)
    return bytes(header) + payload


def fatbin(entries: list[tuple[int, int]]) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """A fatbin blob of entries (kind, arch), each payload bytes of its own; and
    (kind, arch, payload) per entry."""
    made = [(kind, arch, bytes([i + 1]) * (24 + 8 * i)) for i, (kind, arch) in enumerate(entries)]
    body = b"".join(fatbin_entry(kind, arch, payload) for kind, arch, payload in made)
    return bundle.FATBIN_HEADER.pack(bundle.FATBIN_MAGIC, 1, 16, len(body)) + body, made


def elf(sections: dict[str, bytes]) -> bytes:
    """A 64-bit little-endian ELF file with these sections (and .shstrtab)."""
    names = b"\0" + b"".join(name.encode() + b"\0" for name in [*sections, ".shstrtab"])
    contents = [*sections.values(), names]
    offset, headers, data = 64, [bytes(64)], b""
    position = 1
    for name, content in zip([*sections, ".shstrtab"], contents, strict=True):
        headers.append(
            struct.pack("<IIQQQQIIQQ", position, 1, 0, 0, offset, len(content), 0, 0, 8, 0)
        )
        position += len(name) + 1
        offset += len(content)
        data += content
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, offset, 0, 64, 0, 0, 64, len(headers), len(headers) - 1
    )
    return header + data + b"".join(headers)


@pytest.mark.parametrize(
    ("kind", "arch", "runs"),
    [(CUBIN, 90, True), (CUBIN, 80, False), (CUBIN, 100, False), (PTX, 80, True),
     (PTX, 90, True), (PTX, 100, False)],
)  # fmt: skip
def test_an_h200_runs_sm90_cubins_and_ptx_up_to_compute_90(
    kind: int, arch: int, runs: bool
) -> None:
    assert bundle.runs_on(kind, arch) is runs


def test_pruning_zeroes_only_what_no_sm90_gpu_runs() -> None:
    first, made_first = fatbin([(CUBIN, 80), (CUBIN, 90), (PTX, 80)])
    second, made_second = fatbin([(CUBIN, 100), (PTX, 100), (CUBIN, 90)])
    data = elf({".text": b"\x90" * 40, ".nv_fatbin": first + bytes(8) + second})
    pruned, kept, zeroed = bundle.prune_fatbin(data)
    assert len(pruned) == len(data)
    for kind, arch, payload in made_first + made_second:
        at = data.index(fatbin_entry(kind, arch, payload)) + ENTRY_HEADER_SIZE
        header = slice(at - ENTRY_HEADER_SIZE, at)
        assert pruned[header] == data[header], "an entry's header changed"
        expected = payload if bundle.runs_on(kind, arch) else bytes(len(payload))
        assert pruned[at : at + len(payload)] == expected, (kind, arch)
    assert set(kept) == {(CUBIN, 90), (PTX, 80)}
    assert set(zeroed) == {(CUBIN, 80), (CUBIN, 100), (PTX, 100)}
    # Outside the zeroed payloads nothing changed.
    changed = [i for i, (a, b) in enumerate(zip(data, pruned, strict=True)) if a != b]
    assert len(changed) == sum(zeroed.values())


def test_a_file_without_sm90_code_is_refused() -> None:
    blob, _ = fatbin([(CUBIN, 80), (PTX, 100)])
    with pytest.raises(bundle.FatbinError, match="no fatbin entry runs on sm_90"):
        bundle.prune_fatbin(elf({".nv_fatbin": blob}))
    with pytest.raises(bundle.FatbinError, match=r"no \.nv_fatbin section"):
        bundle.prune_fatbin(elf({".text": b"\0" * 16}))
    with pytest.raises(bundle.FatbinError, match="not a 64-bit"):
        bundle.prune_fatbin(b"MZ" + bytes(100))


def test_an_entry_past_its_fatbin_is_refused() -> None:
    blob, _ = fatbin([(CUBIN, 90)])
    broken = bundle.FATBIN_HEADER.pack(bundle.FATBIN_MAGIC, 1, 16, len(blob) - 24) + blob[16:-8]
    with pytest.raises(bundle.FatbinError, match="unreadable fatbin entry"):
        bundle.prune_fatbin(elf({".nv_fatbin": broken}))


def test_the_vllm_wheel_keeps_what_the_run_loads(tmp_path: Path) -> None:
    blob, made = fatbin([(CUBIN, 80), (CUBIN, 90)])
    c_so = elf({".nv_fatbin": blob})
    files = {
        bundle.C_SO: c_so,
        bundle.FA3_SO: b"fa3" * 100,
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2",
        "vllm/vllm_flash_attn/cute/interface.py": b"",
        "vllm/vllm_flash_attn/__init__.py": b"",
        "vllm/_moe_C.abi3.so": b"moe",
        "vllm/_C_stable_libtorch.abi3.so": b"stable",
        "vllm/_flashmla_C.abi3.so": b"mla",
        "vllm/third_party/deep_gemm/include/a.h": b"",
        "vllm/third_party/triton_kernels/__init__.py": b"",
        "vllm/__init__.py": b"",
        "vllm-0.20.0.dist-info/METADATA": b"Name: vllm\n",
    }
    wheel = tmp_path / "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    out = Path(bundle.trim_vllm(str(wheel), str(tmp_path / "out")))
    assert out.name == wheel.name
    assert sorted(zipfile.ZipFile(out).namelist()) == sorted(
        [
            "vllm-0.20.0.dist-info/METADATA",
            "vllm/__init__.py",
            "vllm/_C_stable_libtorch.abi3.so",
            "vllm/third_party/triton_kernels/__init__.py",
            "vllm/vllm_flash_attn/__init__.py",
        ]
    )
    assert lzma.decompress((out.parent / "fa3.so.xz").read_bytes()) == files[bundle.FA3_SO]
    c = lzma.decompress((out.parent / "c.so.xz").read_bytes())
    assert c == bundle.prune_fatbin(c_so)[0] and c != c_so
    assert made[1][2] in c and made[0][2] not in c


@pytest.mark.parametrize(
    ("trim", "wheel_name", "kept", "dropped"),
    [
        pytest.param(
            "trim_flashinfer",
            "flashinfer_python-0.6.8.post1-py3-none-any.whl",
            [
                "flashinfer/__init__.py",
                "flashinfer/data/csrc/selective_state_update.cu",
                "flashinfer/data/csrc/flashinfer_mamba_binding.cu",
                "flashinfer/data/csrc/tvm_ffi_utils.h",
                "flashinfer/data/include/flashinfer/math.cuh",
                "flashinfer/data/cutlass/include/cute/a.hpp",
            ],
            ["flashinfer/data/csrc/sampling.cu", "flashinfer/data/cutlass/examples/a.cu"],
            id="flashinfer keeps its Mamba sources",
        ),
        pytest.param(
            "trim_xgrammar",
            "xgrammar-0.1.32-cp312-cp312-manylinux_2_28_x86_64.whl",
            [
                "xgrammar/__init__.py",
                "xgrammar/xgrammar_bindings.cpython-312-x86_64-linux-gnu.so",
                "xgrammar/kernels/apply_token_bitmask_inplace_cuda.cu",
                "xgrammar-0.1.32.dist-info/METADATA",
            ],
            ["xgrammar/lib/libxgrammar.a", "xgrammar/include/xgrammar/xgrammar.h"],
            id="xgrammar keeps its Python package and bindings",
        ),
    ],
)
def test_a_trimmed_wheel_keeps_what_the_run_loads(
    tmp_path: Path, trim: str, wheel_name: str, kept: list[str], dropped: list[str]
) -> None:
    wheel = tmp_path / wheel_name
    with zipfile.ZipFile(wheel, "w") as z:
        for name in kept + dropped:
            z.writestr(name, b"x")
    out = getattr(bundle, trim)(str(wheel), str(tmp_path / "out"))
    assert sorted(zipfile.ZipFile(out).namelist()) == sorted(kept)


def test_a_staging_folder_that_does_not_fit_a_call_is_named(tmp_path: Path) -> None:
    small, large = tmp_path / "s1", tmp_path / "s2"
    (small / "sub").mkdir(parents=True)
    large.mkdir()
    (small / "a.whl").write_bytes(bytes(300))
    (small / "sub" / "b.whl").write_bytes(bytes(100))
    (large / "c.whl").write_bytes(bytes(700))
    assert bundle.check_calls(200, [str(small)], limit=600) == {str(small): 600}
    with pytest.raises(bundle.CallTooLarge, match="s2") as raised:
        bundle.check_calls(200, [str(small), str(large)], limit=600)
    assert "s1" not in str(raised.value).replace(str(tmp_path), "")
    with pytest.raises(bundle.CallTooLarge, match="s1"):  # the repository counts
        bundle.check_calls(201, [str(small)], limit=600)


def test_the_bundle_pins_what_the_patch_knows_of_vllm_0_20_0() -> None:
    """bundle-0.20.sh checks the wheel's pins against these; they must be the
    release table's (vllm_patch/releases.py), read from the same wheel."""
    from vllm_patch import releases

    release = releases.get("0.20.0")
    script = Path(__file__).with_name("bundle-0.20.sh").read_text()
    assert f'"torch=={release.torch}"' in script
    assert f'"flashinfer-python=={release.flashinfer}"' in script
    assert f"flashinfer-python=={release.flashinfer}\n" in script


def test_the_structured_output_backends_are_bundled_within_the_wheels_pins() -> None:
    """vllm.v1.structured_output imports both backends at import: bundle-0.20.sh checks
    the wheel's ranges for them and bundles one version of each inside its range."""
    from packaging.specifiers import SpecifierSet

    script = Path(__file__).with_name("bundle-0.20.sh").read_text()
    for range_, bundled in [
        ("llguidance<1.4.0,>=1.3.0", "llguidance==1.3.0"),
        ("xgrammar<1.0.0,>=0.1.32", "xgrammar==0.1.32"),
    ]:
        assert f'"{range_}"' in script
        assert f"{bundled}\n" in script or f"{bundled})" in script
        name, version = bundled.split("==")
        assert version in SpecifierSet(range_.removeprefix(name))
