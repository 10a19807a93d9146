"""The build files' edits: a source tree's CMake builds the seed op as `_mamba_sr_C`, and its
setup.py asks for that extension in CUDA builds.

Each release's own CMakeLists.txt and setup.py are read from its sdist (fetched by
.ci/install-checks.sh; nothing is downloaded here).  The CMake site is found in CMake's
grammar (targets/cmake_lists.py), the setup.py one in Python's.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import commit, run, small_git_copy
from vllm_patch import cache, releases, sdist, targets
from vllm_patch.releases import Design
from vllm_patch.syntax import SiteError, Source, apply_all, landing, revert_all
from vllm_patch.targets import cmake_lists, custom_ops, setup_py

BUILD_FILES = (cmake_lists.PATH, setup_py.PATH)


def release_file(release: releases.Release, path: str) -> str:
    if not sdist.cached(release.version):
        pytest.fail(f"vLLM {release.version}'s sdist is not cached: run .ci/install-checks.sh")
    return sdist.read_members(release.version, [path])[path].decode()


# --- CMakeLists.txt -------------------------------------------------------------------------


def depths(text: str) -> list[tuple[cmake_lists.Command, int]]:
    """Each command of a CMake file with the block depth it is at."""
    found, _ = cmake_lists.commands(text.splitlines(keepends=True))
    depth, result = 0, []
    for command in found:
        if command.name in ("endif", "endforeach", "endwhile", "endfunction", "endmacro"):
            depth -= 1
        result.append((command, depth))
        if command.name in ("if", "foreach", "while", "function", "macro"):
            depth += 1
    assert depth == 0
    return result


@pytest.mark.parametrize("release", releases.RELEASES, ids=lambda r: r.version)
def test_the_cmake_target_lands_before_the_external_projects_and_reverts(
    release: releases.Release,
) -> None:
    pristine = release_file(release, cmake_lists.PATH)
    patched = apply_all(pristine, cmake_lists.operations())
    block = landing("cmake_mamba_sr_target.cmake")
    assert patched.count(block) == 1
    before, _, after = patched.partition(block)
    assert before + after[1:] == pristine and after.startswith("\n")  # a blank line after it
    # The anchor in every release: the commented block that includes triton_kernels.cmake.
    assert after[1:].startswith(
        "# For CUDA and HIP builds also build the triton_kernels external package.\n"
        'if(VLLM_GPU_LANG STREQUAL "CUDA" OR VLLM_GPU_LANG STREQUAL "HIP")\n'
    )
    commands = depths(patched)
    opening = before.count("\n") + block.splitlines().index('if(VLLM_GPU_LANG STREQUAL "CUDA")')
    (ours,) = [i for i, (c, _) in enumerate(commands) if c.first == opening]
    assert commands[ours][1] == 0  # at top level
    names = [c.name for c, _ in commands]
    targets_defined = [
        c.arguments.split()[0] for c, _ in commands if c.name == "define_extension_target"
    ]
    # After vLLM's own targets and where the architectures are set, before any external
    # project (vllm_flash_attn.cmake overrides CMake functions).
    assert targets_defined[-1] == cmake_lists.EXTENSION
    includes = [
        i
        for i, (c, _) in enumerate(commands)
        if c.name == "include" and cmake_lists.EXTERNAL_PROJECTS in c.arguments
    ]
    assert ours < includes[0] and names.index("override_gpu_arches") < ours
    assert revert_all(patched, cmake_lists.operations()) == pristine


def test_the_target_builds_the_source_the_patch_adds() -> None:
    block = landing("cmake_mamba_sr_target.cmake")
    assert f'"{cmake_lists.SOURCE}"' in block and f"{cmake_lists.EXTENSION}\n" in block
    assert "USE_SABI 3" in block and "WITH_SOABI" in block
    assert "_C_stable_libtorch" in block  # it says why it is not a stable target


def test_a_cmake_file_without_the_external_projects_is_refused() -> None:
    text = release_file(releases.NEWEST, cmake_lists.PATH)
    without = text.replace("include(cmake/external_projects/", "include(cmake/elsewhere/")
    with pytest.raises(SiteError) as refused:
        apply_all(without, cmake_lists.operations())
    message = str(refused.value)
    assert message.startswith("build the seed op (csrc/mamba/stock_seeds.cu) as the _mamba_sr_C")
    assert "no `include(cmake/external_projects/...)` command" in message
    no_arches = text.replace("override_gpu_arches(", "other_function(")
    with pytest.raises(SiteError, match="no `override_gpu_arches"):
        apply_all(no_arches, cmake_lists.operations())


def test_check_names_the_file_and_what_it_looked_for(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = small_git_copy(pristine, tmp_path / "vllm")
    cmake = root / cmake_lists.PATH
    cmake.write_text(cmake.read_text().replace("include(cmake/external_projects/", "include(x/"))
    commit(root, "a fork whose CMakeLists.txt includes no external project")
    status, out = run(capsys, "check", root)
    assert status == 1 and "would NOT apply" in out, out
    assert f"conflict       {cmake_lists.PATH}" in out
    assert "no `include(cmake/external_projects/...)` command" in out
    assert f"(vLLM {releases.NEWEST.version})" in out


def test_the_cmake_reader_follows_cmakes_grammar() -> None:
    text = (
        "# a comment (with parentheses\n"
        "#[[ a bracket comment\n"
        "include(cmake/external_projects/not_a_command.cmake) ]]\n"
        'message(STATUS "include(cmake/external_projects/x.cmake) # not a comment")\n'
        "set(ARGS a [=[ ) bracket ]=] (nested (parens)) # comment )\n"
        "  b)\n"
        "override_gpu_arches(VLLM_GPU_ARCHES x)\n"
        "set_gencode_flags_for_srcs(SRCS a)\n"
        "\n"
        "# the comment of the block\n"
        "# over two lines\n"
        "if(A)\n"
        "  foreach(x y)\n"
        "    include(  cmake/external_projects/real.cmake  )\n"
        "  endforeach()\n"
        "endif()\n"
    )
    lines = text.splitlines(keepends=True)
    found, comments = cmake_lists.commands(lines)
    assert [c.name for c in found] == [
        "message",
        "set",
        "override_gpu_arches",
        "set_gencode_flags_for_srcs",
        "if",
        "foreach",
        "include",
        "endforeach",
        "endif",
    ]
    assert (found[1].first, found[1].last) == (4, 5)
    assert {0, 1, 2, 9, 10} <= comments and 3 not in comments
    assert cmake_lists.site(lines) == 9
    top_level = (
        "override_gpu_arches(X)\nset_gencode_flags_for_srcs()\n# c\n"
        "include(cmake/external_projects/a)\n"
    )
    assert cmake_lists.site(top_level.splitlines(keepends=True)) == 2


def test_a_text_file_is_read_as_lines_and_its_edit_checked_on_revert() -> None:
    """A file that is not Python is never parsed as Python (only asked for, its tree says
    it does not parse); revert refuses lines that are not the ones the patch inserted."""
    cmake = release_file(releases.NEWEST, cmake_lists.PATH)
    source = Source(cmake, cmake_lists.PATH)
    with pytest.raises(SiteError, match="does not parse"):
        source.tree  # noqa: B018
    patched = apply_all(cmake, cmake_lists.operations())
    tampered = patched.replace("USE_SABI 3\n    WITH_SOABI)\nendif()", "USE_SABI 3)\nendif()")
    with pytest.raises(SiteError, match="not where the patch puts it"):
        revert_all(tampered, cmake_lists.operations())


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_runs_the_target_for_cuda_and_skips_it_for_hip(tmp_path: Path) -> None:
    """The landed block, run by cmake -P with vLLM's two helpers stubbed: it defines the
    target with the release's variables for CUDA, and nothing for ROCm."""
    (tmp_path / "block.cmake").write_text(landing("cmake_mamba_sr_target.cmake"))
    (tmp_path / "run.cmake").write_text(
        "macro(set_gencode_flags_for_srcs)\n"
        '  cmake_parse_arguments(arg "" "" "SRCS;CUDA_ARCHS" ${ARGN})\n'
        '  message(STATUS "gencode ${arg_SRCS} for ${arg_CUDA_ARCHS}")\n'
        "endmacro()\n"
        "function(define_extension_target NAME)\n"
        '  cmake_parse_arguments(PARSE_ARGV 1 ARG WITH_SOABI "DESTINATION;LANGUAGE;USE_SABI"\n'
        '    "SOURCES;ARCHITECTURES;COMPILE_FLAGS;INCLUDE_DIRECTORIES;LIBRARIES")\n'
        '  message(STATUS "target ${NAME} ${ARG_DESTINATION} ${ARG_LANGUAGE} ${ARG_SOURCES} '
        "${ARG_COMPILE_FLAGS} ${ARG_ARCHITECTURES} ${ARG_USE_SABI} ${ARG_WITH_SOABI} "
        '[${ARG_UNPARSED_ARGUMENTS}]")\n'
        "endfunction()\n"
        'set(CUDA_ARCHS "9.0;10.0")\nset(VLLM_GPU_FLAGS -O3)\nset(VLLM_GPU_ARCHES 90-real)\n'
        "set(VLLM_GPU_LANG CUDA)\ninclude(block.cmake)\n"
        "set(VLLM_GPU_LANG HIP)\ninclude(block.cmake)\n"
    )
    done = subprocess.run(
        ["cmake", "-P", "run.cmake"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [line.removeprefix("-- ") for line in done.stdout.splitlines()]
    assert lines == [
        f"gencode {cmake_lists.SOURCE} for 9.0;10.0",
        "Enabling mamba_sr extension.",
        f"target _mamba_sr_C vllm CUDA {cmake_lists.SOURCE} -O3 90-real 3 TRUE []",
    ]


# --- setup.py -------------------------------------------------------------------------------


def cuda_block(text: str) -> ast.If:
    (block,) = [
        node
        for node in ast.parse(text).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_is_cuda()"
    ]
    return block


@pytest.mark.parametrize("release", releases.RELEASES, ids=lambda r: r.version)
def test_setup_py_asks_for_the_extension_in_cuda_builds_only_and_reverts(
    release: releases.Release,
) -> None:
    pristine = release_file(release, setup_py.PATH)
    patched = apply_all(pristine, setup_py.operations())
    added = 'ext_modules.append(CMakeExtension(name="vllm._mamba_sr_C"))'
    assert patched.count(added) == 1
    # The last statement of the module-level `if _is_cuda():` block, which ROCm skips.
    last = cuda_block(patched).body[-1]
    assert ast.unparse(last) == ast.unparse(ast.parse(added))
    kept = [ast.unparse(node) for node in cuda_block(patched).body[:-1]]
    assert kept == [ast.unparse(node) for node in cuda_block(pristine).body]
    # Its CMake target: setup.py builds and installs `--target`/`--component` name less
    # its `vllm.` prefix.
    assert setup_py.MODULE.removeprefix("vllm.") == cmake_lists.EXTENSION
    assert revert_all(patched, setup_py.operations()) == pristine


def test_a_setup_py_without_a_cuda_block_is_refused() -> None:
    with pytest.raises(SiteError, match="the block for statement of the module-level"):
        apply_all(
            "ext_modules = []\nif _is_cuda() or _is_hip():\n    pass\n", setup_py.operations()
        )


def test_the_build_files_are_edited_only_in_a_source_tree_by_the_reset_design() -> None:
    for design in Design:
        with_setup = targets.file_operations(design, releases.NEWEST, setup_py_present=True)
        without = targets.file_operations(design, releases.NEWEST, setup_py_present=False)
        wanted = design is Design.RESET
        assert all((path in [fo.path for fo in with_setup]) is wanted for path in BUILD_FILES)
        assert not set(BUILD_FILES) & {fo.path for fo in without}


def test_the_pristine_tree_has_the_release_s_build_files(pristine: Path) -> None:
    for path in BUILD_FILES:
        assert (pristine / path).read_text() == release_file(releases.NEWEST, path)
    assert cache.pristine_path(releases.NEWEST).name == f"vllm-{releases.NEWEST.version}"


# --- the export ----------------------------------------------------------------------------


def added_lines(mail: str) -> dict[str, list[str]]:
    """Each file of a `git format-patch` mail, with the lines it adds."""
    files: dict[str, list[str]] = {}
    current = None
    for line in mail.splitlines():
        if line.startswith("diff --git a/"):
            current = files.setdefault(line.split(" b/", 1)[1], [])
        elif current is not None and line.startswith("+") and not line.startswith("+++"):
            current.append(line[1:])
    return files


def test_the_exported_patch_builds_the_op_with_vllms_build_and_vendors_no_cuda_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mail = tmp_path / "reset.patch"
    status, out = run(capsys, "export", "-o", mail)
    assert status == 0, out
    files = added_lines(mail.read_text())
    # The op's source, where vLLM keeps its Mamba kernels, and the build that makes it.
    source = "\n".join(files[cmake_lists.SOURCE]) + "\n"
    assert source == cmake_lists.source_bytes().decode()
    assert '#include "core/registration.h"' in source
    assert "TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, m)" in source
    assert "REGISTER_EXTENSION(TORCH_EXTENSION_NAME)" in source
    assert (
        "\n".join(files[cmake_lists.PATH]) + "\n" == landing("cmake_mamba_sr_target.cmake") + "\n"
    )
    assert files[setup_py.PATH] == [
        '    ext_modules.append(CMakeExtension(name="vllm._mamba_sr_C"))'
    ]
    wrapper = "\n".join(files[custom_ops.PATH])
    assert "def mamba_sr_stock_seeds(out: torch.Tensor) -> None:" in wrapper
    assert "torch.ops._mamba_sr_C.stock_seeds(out)" in wrapper
    # Nothing under vllm/ is a CUDA source or compiles one.
    assert not [path for path in files if path.startswith("vllm/") and path.endswith(".cu")]
    assert not [path for path in files if "cpp_extension" in "\n".join(files[path])]
    assert "package_data" not in "\n".join(files[setup_py.PATH])
