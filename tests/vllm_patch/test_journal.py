"""The journal replays only what it wrote: MANIFEST checked against its sha256, each
blob against its size and sha256, each path inside the tree, no file it does not name.
A damaged new blob is undone from the old bytes; any other damage is refused whole, in
one line, with nothing written."""

from __future__ import annotations

import json
import random
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
    """MANIFEST with `edit` made to its plan, its sha256 made to match: damage that the
    checksum alone would not catch."""
    data = manifest(root)
    data["plan"].update(edit)
    data["sha256"] = journal._digest(journal._canonical(data["plan"]))
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


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:4])
    elif how == "altered":
        path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    else:
        path.unlink()


DAMAGE = ["truncated", "altered", "missing"]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("blob", ["0.new", "1.new"])
def test_a_damaged_new_blob_is_undone_from_the_old_bytes(
    cut_short: Path, blob: str, how: str
) -> None:
    damage(cut_short / journal.JOURNAL / blob, how)
    said = journal.settle(cut_short) or ""
    assert "undid the apply" in said and blob in said, said
    assert (cut_short / "vllm" / "a.py").read_bytes() == OLD
    assert not (cut_short / "vllm" / "sub").exists()
    assert not (cut_short / journal.JOURNAL).exists()


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_old_blob_is_refused(cut_short: Path, how: str) -> None:
    damage(cut_short / journal.JOURNAL / "0.old", how)
    refused(cut_short, "0.old")


def test_a_damaged_old_blob_is_refused_in_an_undo_too(cut_short: Path) -> None:
    jdir = cut_short / journal.JOURNAL
    (jdir / journal.MANIFEST).rename(jdir / journal.ROLLBACK)
    damage(jdir / "0.old", "altered")
    with pytest.raises(journal.JournalError, match=r"0\.old is not the bytes"):
        journal.settle(cut_short)
    assert (cut_short / "vllm" / "a.py").read_bytes() == OLD


@pytest.mark.parametrize("how", ["truncated", "altered"])
def test_a_damaged_manifest_is_refused(cut_short: Path, how: str) -> None:
    path = cut_short / journal.JOURNAL / journal.MANIFEST
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data.replace(b'"apply"', b'"revert"'))
    refused(cut_short, "cannot be replayed")


def test_an_extra_file_in_the_journal_is_refused(cut_short: Path) -> None:
    (cut_short / journal.JOURNAL / "7.new").write_bytes(NEW)
    refused(cut_short, "files it does not name: 7.new")


@pytest.mark.parametrize(
    "path",
    ["../outside.py", "/tmp/outside.py", "vllm/../../outside.py", "vllm//a.py", "./vllm/a.py"],
)
def test_a_path_outside_the_tree_is_refused(cut_short: Path, path: str) -> None:
    files = manifest(cut_short)["plan"]["files"]
    files[1]["path"] = path
    rewrite(cut_short, {"files": files})
    refused(cut_short, "is not a path inside the tree")
    assert not (cut_short.parent / "outside.py").exists()


def test_a_path_into_the_journal_is_refused(cut_short: Path) -> None:
    files = manifest(cut_short)["plan"]["files"]
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
    files = manifest(cut_short)["plan"]["files"]
    files[0]["new_mode"] = "0o777"
    rewrite(cut_short, {"files": files})
    refused(cut_short, "is not a file mode")


def test_random_damage_ends_as_before_as_after_or_in_one_line(tmp_path: Path) -> None:
    """A bounded fuzz test: random damage to a cut-short journal's files and to the
    tree's targets; settle then leaves the tree as before or as after the apply, or
    refuses in one line with the tree as it found it."""
    rng = random.Random(58)
    for case in range(300):
        base = tmp_path / str(case)
        root = base / "tree"
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "a.py").write_bytes(OLD)
        (root / "vllm" / "c.py").write_bytes(OLD)
        changes = {"vllm/a.py": NEW, "vllm/sub/b.py": NEW, "vllm/c.py": None}
        journal._prepare(root, journal._plan(root, changes, (), "apply"))
        before = {"vllm/a.py": OLD, "vllm/c.py": OLD}
        after = {"vllm/a.py": NEW, "vllm/sub/b.py": NEW}
        jdir = root / journal.JOURNAL
        for _ in range(rng.randint(1, 3)):
            victim = rng.choice([*sorted(jdir.iterdir()), root / "vllm" / "a.py"])
            if not victim.exists():
                continue
            data = victim.read_bytes()
            how = rng.choice(["truncate", "flip", "delete", "extra", "append"])
            if how == "truncate":
                victim.write_bytes(data[: rng.randrange(len(data) + 1)])
            elif how == "flip" and data:
                i = rng.randrange(len(data))
                victim.write_bytes(
                    data[:i] + bytes([data[i] ^ 1 << rng.randrange(8)]) + data[i + 1 :]
                )
            elif how == "delete":
                victim.unlink()
            elif how == "extra":
                (jdir / f"{rng.randrange(9)}.{rng.choice(['old', 'new'])}").write_bytes(data)
            else:
                victim.write_bytes(data + b"x")
        found = tree(root)
        try:
            said = journal.settle(root) or ""
        except journal.JournalError as error:
            assert "\n" not in str(error), (case, error)
            assert tree(root) == found, case
            continue
        expected = (
            after
            if "finished" in said
            else before
            if "undid" in said
            else found  # no MANIFEST: the apply had not begun
        )
        assert tree(root) == expected, (case, said)
        assert not jdir.exists() and sorted(p.name for p in base.iterdir()) == ["tree"]


def tree(root: Path) -> dict[str, bytes]:
    """The tree's files, the journal's left out."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.relative_to(root).as_posix().startswith(journal.JOURNAL)
    }


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_a_journal_path_that_is_not_a_folder_is_one_line(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "tree"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "a.py").write_bytes(OLD)
    if kind == "file":
        (root / journal.JOURNAL).write_bytes(b"")
    else:
        (tmp_path / "elsewhere").mkdir()
        (root / journal.JOURNAL).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(journal.JournalError, match="is not a folder") as error:
        journal.replace_files(root, {"vllm/a.py": NEW})
    assert "\n" not in str(error.value)
    assert (root / "vllm" / "a.py").read_bytes() == OLD
