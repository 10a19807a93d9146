"""The journal replays only what it wrote: each blob checked against its sha256, each
path inside the tree; a journal that fails a check is refused whole and nothing is
written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_patch import journal

OLD = b"old text\n"
NEW = b"new text, longer than the old\n"


@pytest.fixture
def cut_short(tmp_path: Path) -> Path:
    """A tree whose apply was killed right after its journal was committed: MANIFEST in
    place, no target file touched yet."""
    root = tmp_path / "tree"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "a.py").write_bytes(OLD)
    plan = journal._plan(root, {"vllm/a.py": NEW, "vllm/sub/b.py": NEW}, (), "apply")
    journal._prepare(root, plan)
    return root


def manifest(root: Path) -> dict:
    return json.loads((root / journal.JOURNAL / journal.MANIFEST).read_bytes())


def rewrite(root: Path, edit: dict) -> None:
    data = manifest(root)
    data.update(edit)
    (root / journal.JOURNAL / journal.MANIFEST).write_text(json.dumps(data))


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.parent.rglob("*"))
        if p.is_file() and journal.JOURNAL not in p.relative_to(root.parent).as_posix()
    }


def test_an_intact_journal_is_finished(cut_short: Path) -> None:
    """The control: the same journal, undamaged, is replayed."""
    assert "finished the apply" in (journal.settle(cut_short) or "")
    assert (cut_short / "vllm" / "a.py").read_bytes() == NEW
    assert (cut_short / "vllm" / "sub" / "b.py").read_bytes() == NEW
    assert not (cut_short / journal.JOURNAL).exists()


def refused(root: Path, reason: str) -> None:
    before = tree_files(root)
    with pytest.raises(journal.JournalError, match=reason) as error:
        journal.settle(root)
    assert "\n" not in str(error.value) and "changed nothing" in str(error.value)
    assert tree_files(root) == before
    assert (root / journal.JOURNAL / journal.MANIFEST).is_file()  # kept, for the user


@pytest.mark.parametrize("blob", ["0.new", "0.old", "1.new"])
def test_a_truncated_blob_is_refused(cut_short: Path, blob: str) -> None:
    path = cut_short / journal.JOURNAL / blob
    path.write_bytes(path.read_bytes()[:4])
    refused(cut_short, f"{blob} is not the blob its sha256 names")


def test_a_missing_blob_is_refused(cut_short: Path) -> None:
    (cut_short / journal.JOURNAL / "0.new").unlink()
    refused(cut_short, "cannot be replayed")


@pytest.mark.parametrize(
    "path",
    ["../outside.py", "/tmp/outside.py", "vllm/../../outside.py", "vllm//a.py", "./vllm/a.py"],
)
def test_a_path_outside_the_tree_is_refused(cut_short: Path, path: str) -> None:
    files = manifest(cut_short)["files"]
    files[1]["path"] = path
    rewrite(cut_short, {"files": files})
    refused(cut_short, "is not a path inside the tree")
    assert not (cut_short.parent / "outside.py").exists()


def test_a_path_into_the_journal_is_refused(cut_short: Path) -> None:
    files = manifest(cut_short)["files"]
    files[1]["path"] = f"{journal.JOURNAL}/{journal.MANIFEST}"
    rewrite(cut_short, {"files": files})
    refused(cut_short, "is not a path inside the tree")


def test_a_symlink_out_of_the_tree_is_refused(cut_short: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (cut_short / "vllm" / "sub").symlink_to(outside)
    refused(cut_short, "leads out of the tree")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [("made", ["../made"]), ("removed", [["../gone", 0o755]]), ("removed", [["vllm", -1]])],
)
def test_directories_are_checked_too(cut_short: Path, key: str, value: list) -> None:
    rewrite(cut_short, {key: value})
    refused(cut_short, "cannot be replayed")


def test_a_mode_that_is_not_one_is_refused(cut_short: Path) -> None:
    files = manifest(cut_short)["files"]
    files[0]["new_mode"] = "0o777"
    rewrite(cut_short, {"files": files})
    refused(cut_short, "is not a file mode")
