"""The data files shipped in ``data/`` and the SHA-256 manifest that proves them intact.
Used by notebook 05. Lives in utils/ because :mod:`utils.data` (MNIST, notebook 04) and
:mod:`utils.seq2seq` (the corpus, notebook 05) check each shipped file with it before reading it.

``data/SHA256SUMS`` lists every file the course ships under ``data/`` (the MNIST ``.gz`` files and
their ``MD5SUMS.raw`` for notebook 04, the two translation corpora for notebook 05) with its
SHA-256, in ``sha256sum`` format, so ``cd data && sha256sum -c SHA256SUMS`` checks them by hand.

:func:`check_shipped` compares a file with its manifest line. A damaged file (a flipped byte, a
lost or added line, a truncation, an empty file) raises :class:`DataFileError` whose message names
the file and says how to restore it, *before* a reader turns the damage into a confusing error
later (an ``IndexError``, a bare ``AssertionError``, a ``UnicodeDecodeError`` without the file
name) or, worse, into silently different data (``chair`` read as ``bhair``).

Used by :mod:`utils.data` (MNIST, notebook 04), :mod:`utils.seq2seq` and
:mod:`tools.translation_corpus` (the corpus, notebook 05); ``python -m tools.translation_corpus``
rewrites the corpus lines of the manifest when it regenerates the corpus.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from utils.paths import DATA_DIR, relpath

MANIFEST: Path = DATA_DIR / "SHA256SUMS"
"""``sha256sum`` lines for every shipped data file, paths relative to ``data/``."""

MANIFEST_SHA256 = "dc4deca222feabcb9b244e6b9ebe71f536987405814f55dcdfcf57710799976c"
"""The SHA-256 of the course's ``data/SHA256SUMS`` itself: a changed digit or a lost line of the manifest is blamed
on the manifest, not on the intact data file it describes (probes D15, D16). :func:`update_manifest` rewrites it."""
_COURSE_MANIFEST: Path = DATA_DIR / "SHA256SUMS"

RESTORE_HINT = (
    "restore the shipped copy with `git checkout -- {path}` (or copy it from a fresh clone of the course; "
    "data/README.md says where each file comes from)"
)


class DataFileError(RuntimeError):
    """A shipped data file is missing, truncated or corrupt (its message names the file and the fix)."""


def restore_hint(path: str | os.PathLike[str]) -> str:
    """How to get ``path`` back: the ``git checkout`` line for it."""
    return RESTORE_HINT.format(path=relpath(path))


def file_digest(path: str | os.PathLike[str], algorithm: str = "sha256", chunk: int = 1 << 20) -> str:
    """The digest of a file's bytes in hex (SHA-256 by default; MNIST's list uses ``"md5"``)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_sums(path: Path, algorithm: str, hint: str) -> dict[str, str]:
    """``{file: digest}`` from a list in the format of ``sha256sum``/``md5sum`` (``DIGEST  FILE`` lines).

    Raises:
        DataFileError: the list is not ASCII, or a line is not ``DIGEST  FILE``; the message names the
            list and ends with ``hint`` (how to restore it).
    """
    digits = 2 * hashlib.new(algorithm).digest_size
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError as err:
        raise DataFileError(f"{relpath(path)} is corrupt (not plain ASCII): {hint}") from err
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        m = re.fullmatch(rf"([0-9a-f]{{{digits}}}) [ *](\S+)", line)
        if not m:
            raise DataFileError(
                f"{relpath(path)} line {number} is not '{algorithm.upper()}  FILE' (the list is corrupt): {hint}"
            )
        sums[m.group(2)] = m.group(1)
    return sums


def _is_course_manifest(manifest: Path) -> bool:
    try:
        return manifest.resolve() == _COURSE_MANIFEST.resolve()
    except OSError:
        return False


def read_manifest(manifest: Path | None = None) -> dict[str, str]:
    """``{path relative to the manifest's folder: sha256}``; a damaged manifest raises :class:`DataFileError`.

    The course's own manifest is first compared with :data:`MANIFEST_SHA256`, so that a damaged line (a changed
    digit, a lost line) is blamed on the manifest rather than on the data file it describes.
    """
    manifest = manifest or MANIFEST
    if not manifest.is_file():
        raise DataFileError(f"{relpath(manifest)} is missing: {restore_hint(manifest)}")
    if _is_course_manifest(manifest) and (actual := file_digest(manifest)) != MANIFEST_SHA256:
        size = manifest.stat().st_size
        raise DataFileError(
            f"{relpath(manifest)} is damaged: its SHA-256 is {actual[:12]}…, utils/shipped.py says "
            f"{MANIFEST_SHA256[:12]}… ({size:,} bytes); the data files were not checked against it. "
            f"{restore_hint(manifest)[0].upper()}{restore_hint(manifest)[1:]}"
        )
    return read_sums(manifest, "sha256", restore_hint(manifest))


def _key(path: Path, folder: Path) -> str | None:
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return None


def is_shipped(path: str | os.PathLike[str], manifest: Path | None = None) -> bool:
    """True when ``path`` is one of the files the manifest lists (a file of your own is not)."""
    manifest = manifest or MANIFEST
    key = _key(Path(path), manifest.parent)
    return key is not None and key in read_manifest(manifest)


def check_shipped(path: str | os.PathLike[str], manifest: Path | None = None) -> bool:
    """Check a file against its manifest line; return False when the manifest does not list it.

    Raises:
        FileNotFoundError: a listed file is missing (the message says how to restore it).
        DataFileError: a listed file's SHA-256 differs from the manifest's: it is damaged.
    """
    manifest, path = manifest or MANIFEST, Path(path)
    key = _key(path, manifest.parent)
    if key is None:
        return False
    expected = read_manifest(manifest).get(key)
    if expected is None:
        return False
    if not path.is_file():
        raise FileNotFoundError(f"{relpath(path)} is missing: {restore_hint(path)}")
    actual = file_digest(path)
    if actual != expected:
        size = path.stat().st_size
        raise DataFileError(
            f"{relpath(path)} is damaged: its SHA-256 is {actual[:12]}…, {relpath(manifest)} says {expected[:12]}… "
            f"({size:,} bytes{', empty' if size == 0 else ''}); {restore_hint(path)}"
        )
    return True


def update_manifest(paths: list[Path], manifest: Path | None = None) -> None:
    """Write the current SHA-256 of ``paths`` into the manifest (for files the course regenerates).

    A damaged manifest is refused (its other lines would be trusted); for the course's own manifest the new
    digest of the manifest is written into :data:`MANIFEST_SHA256`, in this module's source.
    """
    manifest = manifest or MANIFEST
    sums = read_manifest(manifest) if manifest.is_file() else {}
    for path in paths:
        key = _key(path, manifest.parent)
        if key is None:
            raise ValueError(f"{path} is outside {relpath(manifest.parent)}/: the manifest lists only shipped files")
        sums[key] = file_digest(path)
    manifest.write_text("".join(f"{digest}  {key}\n" for key, digest in sorted(sums.items())), encoding="ascii")
    if _is_course_manifest(manifest):
        _set_manifest_sha256(file_digest(manifest))


def _set_manifest_sha256(digest: str) -> None:
    """Write the new digest of the course's manifest into this file (:data:`MANIFEST_SHA256`) and this module."""
    global MANIFEST_SHA256
    source = Path(__file__)
    text, count = re.subn(
        r'^MANIFEST_SHA256 = "[0-9a-f]{64}"$', f'MANIFEST_SHA256 = "{digest}"', source.read_text(), flags=re.M
    )
    if count != 1:
        raise RuntimeError(f'{source}: no line MANIFEST_SHA256 = "..." to update')
    source.write_text(text)
    MANIFEST_SHA256 = digest
