"""Corpus reading and batching for notebook 05. Used by notebook 05. Lives in utils/ because
``benchmarks/seq2seq_speed.py``, the tests and the corpus generator (``tools/translation_corpus.py``) read the
corpus with the same code.

Only the plumbing that is not the lesson lives here; the encoder, the decoders and their attention,
the training step, greedy decoding and evaluation are written in notebook 05 itself, and the
benchmark and tests run those cells (:mod:`tools.lesson_code`). What is here:

* text: :func:`normalize_string` (the notes' normalisation, with French ligatures fixed),
  :func:`read_pairs` (Tatoeba's tab-separated ``eng-fra.txt`` or the course's generated corpus, checked
  against ``data/SHA256SUMS``), :func:`read_compositional` (the compositional split, with its held-out
  categories), and the corpus files' paths and sizes (:data:`CORPUS_FILE`, :data:`COMPOSITIONAL_FILE`),
  :func:`filter_pairs` (the notes' length and "i am / he is ..." filters), :func:`split_pairs`
  (train / validation / test by sentence);
* vocabulary: :class:`Lang` with padding, start, end and unknown tokens;
* batching: :func:`batch_tensors` and :func:`make_batches` (padding, lengths, length buckets).
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from utils.paths import DATA_DIR, relpath
from utils.shipped import DataFileError, check_shipped

PAD_token, SOS_token, EOS_token, UNK_token = 0, 1, 2, 3
"""Special indices. The notes had SOS=0 and EOS=1 and no padding (they trained one pair at a time);
batches need a padding index, and index 0 is the natural choice for ``padding_idx``."""

MAX_LENGTH = 13
"""Longest sentence kept, in tokens including the end token: 12 words/punctuation + EOS."""

ENG_PREFIXES = (
    "i am ",
    "i m ",
    "he is",
    "he s ",
    "she is",
    "she s ",
    "you are",
    "you re ",
    "we are",
    "we re ",
    "they are",
    "they re ",
)
"""The notes' filter on the English side of Tatoeba (after normalisation)."""

CORPUS_FILE: Path = DATA_DIR / "eng-fra-course.txt"
"""The course's generated pairs (English<TAB>French) for training and the random test split."""

COMPOSITIONAL_FILE: Path = DATA_DIR / "eng-fra-course-compositional.txt"
"""Generated pairs whose word/structure combinations never occur in :data:`CORPUS_FILE` (third column: which)."""

N_PAIRS = 24_000
N_COMPOSITIONAL = 1_000
"""How many pairs each file holds (``python -m tools.translation_corpus`` writes both)."""

# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

_LIGATURES = str.maketrans({"œ": "oe", "Œ": "OE", "æ": "ae", "Æ": "AE"})


def unicode_to_ascii(s: str) -> str:
    """Drop accents: decompose (NFD) and remove the combining marks.

    The notes' version leaves ``œ`` alone (it is a letter, not a letter plus a mark), and their
    next step then replaces it by a space: ``sœur`` became ``s ur``. Ligatures are spelled out first.
    """
    if not isinstance(s, str):
        raise TypeError(f"unicode_to_ascii() expects a str, got {type(s).__name__}")
    s = s.translate(_LIGATURES)
    return "".join(c for c in unicodedata.normalize("NFD", s) if unicodedata.category(c) != "Mn")


def normalize_string(s: str) -> str:
    """The notes' normalisation: ASCII, lower case, ``.!?`` split off, other non-letters -> one space.

    >>> normalize_string("Ne l'a-t-elle pas vue ?")
    'ne l a t elle pas vue ?'
    """
    if not isinstance(s, str):
        raise TypeError(f"normalize_string() expects a str, got {type(s).__name__}")
    s = unicode_to_ascii(s.lower().strip())
    s = re.sub(r"([.!?])", r" \1", s)
    s = re.sub(r"[^a-zA-Z.!?]+", r" ", s)
    return s.strip()


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 corpus file; a shipped file is first checked against ``data/SHA256SUMS``.

    Raises:
        FileNotFoundError: no such file (for a shipped file, the message says how to restore it).
        DataFileError: a shipped file is damaged, a file is not UTF-8 or holds no line (each message
            names the file and says how to restore or fix it).
    """
    path = Path(path)
    check_shipped(path)  # first: a missing shipped file gets the line that restores it (probe C1)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataFileError(
            f"{relpath(path)} is not UTF-8 text (byte {err.start} cannot be decoded): is it the right "
            f"file? Save it as UTF-8"
        ) from err
    if not any(line.strip() for line in lines):
        raise DataFileError(f"{relpath(path)} is empty: a corpus file has one English<TAB>French pair per line")
    return lines


def read_pairs(path: str | Path, reverse: bool = True) -> list[tuple[str, str]]:
    """Read a Tatoeba-style file (English<TAB>French[<TAB>attribution]) into normalised pairs.

    Works on the course's generated ``data/eng-fra-course.txt`` and on the real ``eng-fra.txt``
    from https://www.manythings.org/anki/ (whose third column, the attribution, is ignored).
    With ``reverse=True`` (the notes' choice) pairs are ``(french, english)``: French is the source.

    Raises:
        FileNotFoundError: no such file.
        DataFileError: see :func:`read_lines`.
        ValueError: a non-empty line has fewer than two tab-separated columns.
    """
    pairs = []
    for number, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise ValueError(f"{Path(path).name} line {number}: expected English<TAB>French, got {line[:60]!r}")
        eng, fra = normalize_string(cols[0]), normalize_string(cols[1])
        pairs.append((fra, eng) if reverse else (eng, fra))
    return pairs


def read_compositional(path: str | Path = COMPOSITIONAL_FILE) -> list[tuple[str, str, tuple[str, ...]]]:
    """Read the compositional file as ``(french, english, categories)``, sentences normalised.

    Raises:
        FileNotFoundError: no such file.
        DataFileError: see :func:`read_lines`.
        ValueError: a line lacks the third column (then it is not a compositional file).
    """
    path = Path(path)
    out = []
    for number, line in enumerate(read_lines(path), 1):
        cols = line.split("\t")
        if len(cols) != 3:
            raise ValueError(f"{path.name} line {number}: expected English<TAB>French<TAB>combinations")
        categories = tuple(sorted({c.strip().split("(")[0] for c in cols[2].split(";")}))
        out.append((normalize_string(cols[1]), normalize_string(cols[0]), categories))
    return out


def filter_pairs(
    pairs: Iterable[tuple[str, str]], max_length: int = MAX_LENGTH, prefixes: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """Keep pairs whose two sides have fewer than ``max_length`` tokens (room for EOS).

    ``prefixes``: keep only pairs whose *target* (second item) starts with one of them; pass
    :data:`ENG_PREFIXES` to reproduce the notes' "i am / he is / ..." filter on real Tatoeba data.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    if isinstance(prefixes, str):  # tuple("i am ") would be its letters: every sentence starting with i, a, m or " "
        raise TypeError(f"prefixes must be a sequence of str such as ENG_PREFIXES, not one str: write [{prefixes!r}]")
    prefixes = tuple(prefixes) if prefixes else None
    return [
        (a, b)
        for a, b in pairs
        if len(a.split(" ")) < max_length
        and len(b.split(" ")) < max_length
        and (prefixes is None or b.startswith(prefixes))
    ]


def split_pairs(
    pairs: Sequence[tuple[str, str]], fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """Split into train / validation / test *by sentence*.

    Pairs that share a source or a target sentence (``tu es fatigue`` and ``vous etes fatigue``
    both mean ``you are tired``) always land in the same split, so no test sentence was seen in
    training on either side. Groups are shuffled with ``seed`` and dealt out by ``fractions``.

    Raises:
        ValueError: fractions are not three non-negative numbers summing to 1 (NaN included).
    """
    # written so that NaN fails: every comparison with NaN is False
    if len(fractions) != 3 or not all(f >= 0 for f in fractions) or not abs(sum(fractions) - 1) <= 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[int, str], int] = {}
    for i, (src, tgt) in enumerate(pairs):
        for key in ((0, src), (1, tgt)):
            j = first.setdefault(key, i)
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(pairs)):
        groups.setdefault(find(i), []).append(i)
    order = sorted(groups.values())
    random.Random(seed).shuffle(order)
    n = len(pairs)
    bounds = (fractions[0] * n, (fractions[0] + fractions[1]) * n)
    out: tuple[list, list, list] = ([], [], [])
    done = 0
    for group in order:
        k = 0 if done < bounds[0] else 1 if done < bounds[1] else 2
        out[k].extend(pairs[i] for i in group)
        done += len(group)
    return out


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------


class UnknownWordError(ValueError):
    """A sentence contains words the model never saw in training."""


class Lang:
    """Word <-> index tables of one language (the notes' ``Lang``, plus padding and unknown words)."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"Lang name must be a str, got {type(name).__name__}")
        self.name = name
        self.word2index: dict[str, int] = {}
        self.word2count: dict[str, int] = {}
        self.index2word: dict[int, str] = {
            PAD_token: "<pad>",
            SOS_token: "<sos>",
            EOS_token: "<eos>",
            UNK_token: "<unk>",
        }

    @property
    def n_words(self) -> int:
        """Vocabulary size, special tokens included."""
        return len(self.index2word)

    @staticmethod
    def _words(sentence: str) -> list[str]:
        if not isinstance(sentence, str):
            raise TypeError(f"a sentence must be a str, got {type(sentence).__name__}")
        if not sentence.strip():
            raise ValueError(
                f"empty sentence {sentence!r}: nothing to encode "
                "(normalize_string leaves nothing of a sentence without letters or . ! ?)"
            )
        words = sentence.split(" ")
        if "" in words:  # "je  suis": the empty word between the spaces would be "not in the vocabulary"
            raise ValueError(
                f"sentence {sentence!r} has a space at its start or end, or two in a row: words are separated by one "
                "space; give it through normalize_string first"
            )
        return words

    def add_sentence(self, sentence: str) -> None:
        for word in self._words(sentence):
            self.add_word(word)

    def add_word(self, word: str) -> None:
        if word not in self.word2index:
            self.word2index[word] = self.n_words
            self.word2count[word] = 1
            self.index2word[self.n_words] = word
        else:
            self.word2count[word] += 1

    def unknown_words(self, sentence: str) -> list[str]:
        """Words of ``sentence`` that are not in the vocabulary, in order."""
        return [w for w in self._words(sentence) if w not in self.word2index]

    def encode(self, sentence: str, unknown: str = "error") -> list[int]:
        """Indices of the words followed by EOS.

        Args:
            unknown: ``"error"`` raises :class:`UnknownWordError` naming every unknown word;
                ``"unk"`` maps them to the ``<unk>`` index.

        Raises:
            TypeError: ``sentence`` is not a str.
            ValueError: ``sentence`` is empty (or only spaces), or ``unknown`` is neither value.
        """
        if unknown not in ("error", "unk"):
            raise ValueError(f"unknown must be 'error' or 'unk', got {unknown!r}")
        missing = self.unknown_words(sentence)
        if missing and unknown == "error":
            raise UnknownWordError(
                f"{len(missing)} word(s) not in the {self.name} vocabulary of {self.n_words - 4} words: "
                + ", ".join(repr(w) for w in missing)
            )
        return [self.word2index.get(w, UNK_token) for w in sentence.split(" ")] + [EOS_token]

    def decode(self, indices: Iterable[int]) -> list[str]:
        """Words of one sentence's ``indices``, stopping at EOS and skipping padding.

        Raises:
            ValueError: ``indices`` is a tensor of more than one dimension (a batch: decode each row).
            IndexError: an index outside this vocabulary (indices made with another ``Lang``?).
        """
        if isinstance(indices, torch.Tensor) and indices.dim() != 1:
            raise ValueError(
                f"decode() takes one sentence: a 1-D sequence of indices, got shape {tuple(indices.shape)}"
                " (for a batch, decode each row)"
            )
        words = []
        for i in indices:
            i = int(i)
            if i == EOS_token:
                break
            if i not in self.index2word:
                raise IndexError(
                    f"index {i} is not in the {self.name} vocabulary (indices 0 to {self.n_words - 1}):"
                    " were these indices made with another vocabulary?"
                )
            if i != PAD_token:
                words.append(self.index2word[i])
        return words


def build_langs(pairs: Iterable[tuple[str, str]], source: str = "fra", target: str = "eng") -> tuple[Lang, Lang]:
    """Vocabularies of the sources and the targets of ``pairs`` (build them from training pairs only)."""
    src, tgt = Lang(source), Lang(target)
    for a, b in pairs:
        src.add_sentence(a)
        tgt.add_sentence(b)
    return src, tgt


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Padded index tensors of a batch of pairs (batch first)."""

    src: torch.Tensor  # [B, S] long, PAD after each sentence's EOS
    src_lengths: torch.Tensor  # [B] long, on the CPU (pack_padded_sequence wants them there)
    tgt: torch.Tensor  # [B, T] long

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device), self.src_lengths, self.tgt.to(device))


def _pad_batch(encoded: Sequence[tuple[list[int], list[int]]]) -> Batch:
    s_len, t_len = max(len(s) for s, _ in encoded), max(len(t) for _, t in encoded)
    src = torch.tensor([s + [PAD_token] * (s_len - len(s)) for s, _ in encoded])
    tgt = torch.tensor([t + [PAD_token] * (t_len - len(t)) for _, t in encoded])
    return Batch(src, torch.tensor([len(s) for s, _ in encoded]), tgt)


def batch_tensors(pairs: Sequence[tuple[str, str]], src_lang: Lang, tgt_lang: Lang, unknown: str = "unk") -> Batch:
    """Encode, append EOS and pad a list of pairs (index 0 = ``<pad>`` after each sentence's EOS)."""
    if not pairs:
        raise ValueError("batch_tensors() needs at least one pair")
    return _pad_batch([(src_lang.encode(a, unknown), tgt_lang.encode(b, unknown)) for a, b in pairs])


def make_batches(
    pairs: Sequence[tuple[str, str]], src_lang: Lang, tgt_lang: Lang, batch_size: int, rng: random.Random | None = None
) -> list[Batch]:
    """Cut ``pairs`` into batches of similar source length (less padding, faster).

    With ``rng`` the pairs are shuffled, then sorted by length inside chunks of 50 batches, and
    the batches are shuffled; without it the order is kept (for evaluation).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if rng is not None and not isinstance(rng, random.Random):  # a seed would fail later at rng.shuffle
        raise TypeError(f"rng must be a random.Random (e.g. random.Random(0)) or None, got {rng!r}")
    encoded = [(src_lang.encode(a, "unk"), tgt_lang.encode(b, "unk")) for a, b in pairs]
    if rng is not None:
        rng.shuffle(encoded)
        chunk = 50 * batch_size
        encoded = [
            p for i in range(0, len(encoded), chunk) for p in sorted(encoded[i : i + chunk], key=lambda p: len(p[0]))
        ]
    batches = [_pad_batch(encoded[i : i + batch_size]) for i in range(0, len(encoded), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches
