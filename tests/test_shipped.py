"""Tests of utils.shipped: every shipped data file is checked against data/SHA256SUMS before it is read.

Each damage below is one the hardening probe (issue 14) made to a copy of ``data/``: before the manifest, a flipped
letter loaded silently, an empty file died later with ``IndexError``, a lost line with a bare ``AssertionError`` and
a byte that is not UTF-8 with a ``UnicodeDecodeError`` that did not name the file.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from utils import shipped
from utils.data import MD5_LIST, MNIST_FILES, prepare_mnist
from utils.paths import DATA_DIR, REPO_ROOT
from utils.seq2seq import COMPOSITIONAL_FILE, CORPUS_FILE, read_compositional, read_lines, read_pairs
from utils.shipped import DataFileError, check_shipped, read_manifest, update_manifest


def test_manifest_lists_every_committed_data_file_with_its_digest():
    try:
        listed = subprocess.run(
            ["git", "ls-files", "data"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    committed = {Path(p).relative_to("data").as_posix() for p in listed} - {"README.md", "SHA256SUMS"}
    manifest = read_manifest()
    assert set(manifest) == committed
    for name in manifest:
        assert check_shipped(DATA_DIR / name) is True


def test_git_never_converts_the_line_endings_of_shipped_files():
    """A checkout that converted line endings (Windows, core.autocrlf) would change every digest."""
    files = ["data/SHA256SUMS", *(f"data/{name}" for name in read_manifest())]
    try:
        attrs = subprocess.run(
            ["git", "check-attr", "text", "--", *files], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert len(attrs) == len(files)
    assert [a for a in attrs if not a.endswith(": text: unset")] == [], ".gitattributes must say: data/** -text"


@pytest.fixture
def corpus_copy(tmp_path, monkeypatch) -> Path:
    """A copy of data/ (corpus files and manifest) that the checks use instead of the real one."""
    data = tmp_path / "data"
    data.mkdir()
    for name in (CORPUS_FILE.name, COMPOSITIONAL_FILE.name, "SHA256SUMS"):
        shutil.copy(DATA_DIR / name, data / name)
    monkeypatch.setattr(shipped, "MANIFEST", data / "SHA256SUMS")
    return data


def _flip_letter(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "chair" in text
    path.write_text(text.replace("chair", "bhair", 1), encoding="utf-8")


def _drop_line(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:100] + lines[101:]), encoding="utf-8")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _not_utf8(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[1000] = 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_flip_letter, _drop_line, _truncate, _empty, _not_utf8])
@pytest.mark.parametrize("name", [CORPUS_FILE.name, COMPOSITIONAL_FILE.name])
def test_a_damaged_corpus_file_is_refused_with_its_name_and_the_fix(corpus_copy, name, damage):
    path = corpus_copy / name
    damage(path)
    reader = read_compositional if name == COMPOSITIONAL_FILE.name else read_pairs
    with pytest.raises(DataFileError, match=rf"{name} is damaged: its SHA-256 is .*git checkout -- .*{name}"):
        reader(path)


def test_a_missing_shipped_file_says_how_to_restore_it(corpus_copy):
    (corpus_copy / CORPUS_FILE.name).unlink()
    with pytest.raises(FileNotFoundError, match=r"eng-fra-course\.txt is missing: restore .*git checkout"):
        check_shipped(corpus_copy / CORPUS_FILE.name)


def test_a_damaged_manifest_names_itself(corpus_copy):
    manifest = corpus_copy / "SHA256SUMS"
    manifest.write_bytes(manifest.read_bytes().replace(b"  ", b" ? ", 1))
    with pytest.raises(DataFileError, match=r"SHA256SUMS line 1 is not 'SHA256  FILE'"):
        read_pairs(corpus_copy / CORPUS_FILE.name)
    manifest.write_bytes(b"\xff\xfe")
    with pytest.raises(DataFileError, match=r"SHA256SUMS is corrupt \(not plain ASCII\)"):
        read_pairs(corpus_copy / CORPUS_FILE.name)


def test_a_corpus_of_your_own_is_read_without_a_digest_but_bad_bytes_name_it(tmp_path):
    own = tmp_path / "eng-fra.txt"
    own.write_text("I am cold.\tJ'ai froid.\n", encoding="utf-8")
    assert check_shipped(own) is False
    assert read_pairs(own) == [("j ai froid .", "i am cold .")]
    own.write_bytes(b"I am cold.\tJ'ai froid \xe9.\n")  # Latin-1, not UTF-8
    with pytest.raises(DataFileError, match=r"eng-fra\.txt is not UTF-8 text \(byte 22 cannot be decoded\)"):
        read_pairs(own)
    own.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"eng-fra\.txt is empty"):
        read_lines(own)


def test_update_manifest_rewrites_only_the_given_files(corpus_copy):
    manifest = corpus_copy / "SHA256SUMS"
    before = read_manifest(manifest)
    path = corpus_copy / CORPUS_FILE.name
    _drop_line(path)
    update_manifest([path])
    after = read_manifest(manifest)
    assert after[path.name] == hashlib.sha256(path.read_bytes()).hexdigest() != before[path.name]
    assert {k: v for k, v in after.items() if k != path.name} == {k: v for k, v in before.items() if k != path.name}
    assert read_pairs(path)  # consistent again
    with pytest.raises(ValueError, match="outside"):
        update_manifest([Path("/tmp/elsewhere.txt")])


# ------------------------------------------------------------------ MNIST's MD5 list and cache


@pytest.fixture
def mnist_copy(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """Small fake MNIST files in data/mnist/ of a temporary data folder, listed in its own manifest."""
    data = tmp_path / "data"
    src = data / "mnist"
    src.mkdir(parents=True)
    lines = []
    for name in MNIST_FILES:
        contents = f"fake contents of {name}\n".encode() * 50
        (src / f"{name}.gz").write_bytes(gzip.compress(contents, mtime=0))
        lines.append(f"{hashlib.md5(contents).hexdigest()}  {name}\n")
    (src / MD5_LIST).write_text("".join(lines))
    monkeypatch.setattr(shipped, "MANIFEST", data / "SHA256SUMS")
    update_manifest([*src.iterdir()])
    return src, tmp_path / "root"


def test_a_corrupt_md5_list_names_itself(mnist_copy):
    src, root = mnist_copy
    (src / MD5_LIST).write_bytes(b"\x00\xff garbage")
    with pytest.raises(DataFileError, match=r"mnist/MD5SUMS\.raw is damaged.*git checkout"):
        prepare_mnist(src, root)
    shipped.MANIFEST.write_text(
        "".join(line for line in shipped.MANIFEST.read_text().splitlines(keepends=True) if MD5_LIST not in line)
    )  # the list is no longer covered
    with pytest.raises(DataFileError, match=r"MD5SUMS\.raw is corrupt \(not plain ASCII\)"):
        prepare_mnist(src, root)
    (src / MD5_LIST).write_text("this is not an MD5 line\n")
    with pytest.raises(DataFileError, match=r"MD5SUMS\.raw line 1 is not 'MD5  FILE'"):
        prepare_mnist(src, root)


def test_a_wrong_sum_in_the_md5_list_is_not_blamed_on_an_intact_gz(mnist_copy):
    src, root = mnist_copy
    text = (src / MD5_LIST).read_text()
    wrong = text.replace(text[0], "0" if text[0] != "0" else "1", 1)
    (src / MD5_LIST).write_text(wrong)
    with pytest.raises(DataFileError, match=r"MD5SUMS\.raw is damaged"):  # the manifest covers the list
        prepare_mnist(src, root)
    update_manifest([src / MD5_LIST])  # a manifest that agrees with the wrong list: only the .gz are proof now
    with pytest.raises(DataFileError, match=r"MD5SUMS\.raw is corrupt \(the \.gz matches data/SHA256SUMS\)") as err:
        prepare_mnist(src, root)
    assert ".gz or" not in str(err.value)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_mnist_cache_follows_the_umask(mnist_copy, umask, mode):
    src, root = mnist_copy
    old = os.umask(umask)
    try:
        raw = prepare_mnist(src, root)
    finally:
        os.umask(old)
    assert {stat.S_IMODE((raw / name).stat().st_mode) for name in MNIST_FILES} == {mode}


# ------------------------------------------------------------------ round 2 of the probes (issue 31)


@pytest.fixture
def course_manifest_copy(corpus_copy, monkeypatch) -> Path:
    """corpus_copy, whose manifest counts as the course's own (compared with MANIFEST_SHA256)."""
    monkeypatch.setattr(shipped, "_COURSE_MANIFEST", corpus_copy / "SHA256SUMS")
    return corpus_copy


def test_d15_a_damaged_manifest_line_is_blamed_on_the_manifest_not_the_intact_file(course_manifest_copy):
    """Probe D15: one hex digit of the corpus's line in SHA256SUMS changed, the corpus intact."""
    manifest = course_manifest_copy / "SHA256SUMS"
    text = manifest.read_text()
    digest = read_manifest(manifest)[CORPUS_FILE.name]
    manifest.write_text(text.replace(digest, ("6" if digest[0] != "6" else "7") + digest[1:]))
    with pytest.raises(DataFileError, match=r"SHA256SUMS is damaged: .*git checkout -- \S*data/SHA256SUMS`") as info:
        read_pairs(course_manifest_copy / CORPUS_FILE.name)
    assert "eng-fra-course.txt" not in str(info.value)
    manifest.write_text(text)
    assert read_pairs(course_manifest_copy / CORPUS_FILE.name)


def test_d16_a_corpus_missing_from_the_manifest_is_not_read_unchecked(course_manifest_copy):
    """Probe D16: the corpus's line deleted from SHA256SUMS and a letter of the corpus changed: refused."""
    manifest = course_manifest_copy / "SHA256SUMS"
    manifest.write_text("".join(line for line in manifest.read_text().splitlines(True) if "course.txt" not in line))
    _flip_letter(course_manifest_copy / CORPUS_FILE.name)
    with pytest.raises(DataFileError, match=r"SHA256SUMS is damaged"):
        read_pairs(course_manifest_copy / CORPUS_FILE.name)
    with pytest.raises(DataFileError, match=r"SHA256SUMS is damaged"):
        shipped.is_shipped(course_manifest_copy / CORPUS_FILE.name)  # notebook 05's check, no bare AssertionError


def test_the_course_manifest_matches_its_recorded_digest():
    assert shipped.file_digest(shipped.MANIFEST) == shipped.MANIFEST_SHA256, (
        "data/SHA256SUMS changed: update_manifest() (python -m tools.translation_corpus) rewrites MANIFEST_SHA256"
    )


def test_update_manifest_of_the_course_manifest_records_its_new_digest(course_manifest_copy, monkeypatch, tmp_path):
    source = tmp_path / "shipped_copy.py"
    source.write_text(Path(shipped.__file__).read_text())
    monkeypatch.setattr(shipped, "__file__", str(source))
    monkeypatch.setattr(shipped, "MANIFEST_SHA256", shipped.MANIFEST_SHA256)
    path = course_manifest_copy / CORPUS_FILE.name
    _drop_line(path)
    update_manifest([path])
    new = shipped.file_digest(course_manifest_copy / "SHA256SUMS")
    assert shipped.MANIFEST_SHA256 == new and f'MANIFEST_SHA256 = "{new}"' in source.read_text()
    assert read_pairs(path)


@pytest.mark.parametrize("name", [CORPUS_FILE.name, COMPOSITIONAL_FILE.name])
def test_c1_a_deleted_corpus_file_gets_the_restore_line(corpus_copy, name):
    """Probe C1: data/README.md promises the `git checkout` line for a missing file too."""
    (corpus_copy / name).unlink()
    reader = read_compositional if name == COMPOSITIONAL_FILE.name else read_pairs
    with pytest.raises(FileNotFoundError, match=rf"{name} is missing: restore .*git checkout -- .*{name}"):
        reader(corpus_copy / name)


def test_d12_a_cache_file_replaced_by_a_folder_is_named_with_the_fix(mnist_copy):
    """Probe D12: a decompressed MNIST file replaced by a directory."""
    src, root = mnist_copy
    raw = prepare_mnist(src, root)
    (raw / MNIST_FILES[3]).unlink()
    (raw / MNIST_FILES[3]).mkdir()
    with pytest.raises(DataFileError, match=rf"{MNIST_FILES[3]} is a folder: .*Remove the cache \(rm -r .*MNIST\)"):
        prepare_mnist(src, root)
    assert not list(raw.glob("*.tmp"))
