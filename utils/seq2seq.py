"""Sequence-to-sequence translation helpers shared by notebook 05 and ``benchmarks/seq2seq_speed.py``.

What is here, in the order the notebook uses it:

* text: :func:`normalize_string` (the notes' normalisation, with French ligatures fixed),
  :func:`read_pairs` (Tatoeba's tab-separated ``eng-fra.txt`` or the course's generated corpus),
  :func:`filter_pairs` (the notes' length and "i am / he is ..." filters), :func:`split_pairs`
  (train / validation / test by sentence);
* vocabulary: :class:`Lang` with padding, start, end and unknown tokens;
* batching: :func:`batch_tensors` and :func:`make_batches` (padding, lengths, length buckets);
* models: :class:`EncoderRNN` (the notes' GRU encoder, batched with packed sequences),
  :class:`NotesAttnDecoderRNN` (the notes' position-based attention decoder, batched),
  :class:`AdditiveAttention` and :class:`AttnDecoderRNN` (content-based, Bahdanau et al. 2015),
  :class:`Seq2Seq` (teacher forcing, greedy decoding);
* training and evaluation: :func:`train_batch`, :func:`train_pair_notes_style` (the notes'
  one-pair-at-a-time step, for the speed comparison), :func:`translate`, :func:`evaluate`.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD_token, SOS_token, EOS_token, UNK_token = 0, 1, 2, 3
"""Special indices. The notes had SOS=0 and EOS=1 and no padding (they trained one pair at a time);
batches need a padding index, and index 0 is the natural choice for ``padding_idx``."""

MAX_LENGTH = 13
"""Longest sentence kept, in tokens including the end token: 12 words/punctuation + EOS."""

ENG_PREFIXES = ("i am ", "i m ", "he is", "he s ", "she is", "she s ", "you are", "you re ",
                "we are", "we re ", "they are", "they re ")
"""The notes' filter on the English side of Tatoeba (after normalisation)."""

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


def read_pairs(path: str | Path, reverse: bool = True) -> list[tuple[str, str]]:
    """Read a Tatoeba-style file (English<TAB>French[<TAB>attribution]) into normalised pairs.

    Works on the course's generated ``data/eng-fra-course.txt`` and on the real ``eng-fra.txt``
    from https://www.manythings.org/anki/ (whose third column, the attribution, is ignored).
    With ``reverse=True`` (the notes' choice) pairs are ``(french, english)``: French is the source.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a non-empty line has fewer than two tab-separated columns.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {path}")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise ValueError(f"{path.name} line {number}: expected English<TAB>French, got {line[:60]!r}")
        eng, fra = normalize_string(cols[0]), normalize_string(cols[1])
        pairs.append((fra, eng) if reverse else (eng, fra))
    return pairs


def filter_pairs(pairs: Iterable[tuple[str, str]], max_length: int = MAX_LENGTH,
                 prefixes: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """Keep pairs whose two sides have fewer than ``max_length`` tokens (room for EOS).

    ``prefixes``: keep only pairs whose *target* (second item) starts with one of them; pass
    :data:`ENG_PREFIXES` to reproduce the notes' "i am / he is / ..." filter on real Tatoeba data.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    prefixes = tuple(prefixes) if prefixes else None
    return [(a, b) for a, b in pairs
            if len(a.split(" ")) < max_length and len(b.split(" ")) < max_length
            and (prefixes is None or b.startswith(prefixes))]


def split_pairs(pairs: Sequence[tuple[str, str]], fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                seed: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """Split into train / validation / test *by sentence*.

    Pairs that share a source or a target sentence (``tu es fatigue`` and ``vous etes fatigue``
    both mean ``you are tired``) always land in the same split, so no test sentence was seen in
    training on either side. Groups are shuffled with ``seed`` and dealt out by ``fractions``.

    Raises:
        ValueError: fractions are not three non-negative numbers summing to 1.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
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
        self.index2word: dict[int, str] = {PAD_token: "<pad>", SOS_token: "<sos>", EOS_token: "<eos>",
                                           UNK_token: "<unk>"}

    @property
    def n_words(self) -> int:
        """Vocabulary size, special tokens included."""
        return len(self.index2word)

    def add_sentence(self, sentence: str) -> None:
        for word in sentence.split(" "):
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
        return [w for w in sentence.split(" ") if w not in self.word2index]

    def encode(self, sentence: str, unknown: str = "error") -> list[int]:
        """Indices of the words followed by EOS.

        Args:
            unknown: ``"error"`` raises :class:`UnknownWordError` naming every unknown word;
                ``"unk"`` maps them to the ``<unk>`` index.
        """
        if unknown not in ("error", "unk"):
            raise ValueError(f"unknown must be 'error' or 'unk', got {unknown!r}")
        missing = self.unknown_words(sentence)
        if missing and unknown == "error":
            raise UnknownWordError(
                f"{len(missing)} word(s) not in the {self.name} vocabulary of {self.n_words - 4} words: "
                + ", ".join(repr(w) for w in missing))
        return [self.word2index.get(w, UNK_token) for w in sentence.split(" ")] + [EOS_token]

    def decode(self, indices: Iterable[int]) -> list[str]:
        """Words of ``indices``, stopping at EOS and skipping padding."""
        words = []
        for i in indices:
            i = int(i)
            if i == EOS_token:
                break
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


def batch_tensors(pairs: Sequence[tuple[str, str]], src_lang: Lang, tgt_lang: Lang,
                  unknown: str = "unk") -> Batch:
    """Encode, append EOS and pad a list of pairs (index 0 = ``<pad>`` after each sentence's EOS)."""
    if not pairs:
        raise ValueError("batch_tensors() needs at least one pair")
    return _pad_batch([(src_lang.encode(a, unknown), tgt_lang.encode(b, unknown)) for a, b in pairs])


def make_batches(pairs: Sequence[tuple[str, str]], src_lang: Lang, tgt_lang: Lang, batch_size: int,
                 rng: random.Random | None = None) -> list[Batch]:
    """Cut ``pairs`` into batches of similar source length (less padding, faster).

    With ``rng`` the pairs are shuffled, then sorted by length inside chunks of 50 batches, and
    the batches are shuffled; without it the order is kept (for evaluation).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    encoded = [(src_lang.encode(a, "unk"), tgt_lang.encode(b, "unk")) for a, b in pairs]
    if rng is not None:
        rng.shuffle(encoded)
        chunk = 50 * batch_size
        encoded = [p for i in range(0, len(encoded), chunk)
                   for p in sorted(encoded[i:i + chunk], key=lambda p: len(p[0]))]
    batches = [_pad_batch(encoded[i:i + batch_size]) for i in range(0, len(encoded), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class EncoderRNN(nn.Module):
    """The notes' encoder (embedding of size ``hidden_size`` and one GRU layer), batched.

    The notes fed one word at a time; here the whole padded batch goes through the GRU at once,
    packed so that padding never updates the hidden state, and padded outputs are zeros.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size, padding_idx=PAD_token)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)

    def forward(self, src: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``src [B, S]``, ``lengths [B]`` -> outputs ``[B, S, H]`` and last hidden state ``[1, B, H]``."""
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(src), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        outputs, hidden = self.gru(packed)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True, total_length=src.shape[1])
        return outputs, hidden

    def step(self, token: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The notes' one-word step: ``token [1]``, ``hidden [1, 1, H]`` -> output ``[1, 1, H]``, hidden."""
        return self.gru(self.embedding(token).view(1, 1, -1), hidden)


class NotesAttnDecoderRNN(nn.Module):
    """The notes' ``AttnDecoderRNN``, batched. Its attention looks at *positions*, not content.

    ``attn`` maps [embedded previous word; hidden state] to ``max_length`` scores, one per source
    *position*; the encoder outputs enter only afterwards, when the weights average them. The
    weights therefore cannot depend on what the source words are, only on where they are.
    """

    def __init__(self, hidden_size: int, output_size: int, dropout_p: float = 0.1,
                 max_length: int = MAX_LENGTH) -> None:
        super().__init__()
        self.hidden_size, self.output_size, self.max_length = hidden_size, output_size, max_length
        self.embedding = nn.Embedding(output_size, hidden_size, padding_idx=PAD_token)
        self.attn = nn.Linear(hidden_size * 2, max_length)
        self.attn_combine = nn.Linear(hidden_size * 2, hidden_size)
        self.dropout = nn.Dropout(dropout_p)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)

    def forward_step(self, token: torch.Tensor, hidden: torch.Tensor, encoder_outputs: torch.Tensor,
                     src_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step. ``token [B]``, ``hidden [1, B, H]``, ``encoder_outputs [B, S, H]`` (S <= max_length).

        ``src_mask`` is accepted for a common interface and ignored, as in the notes: the softmax
        runs over all ``max_length`` positions, those past the sentence hold zero vectors.
        Returns log-probabilities ``[B, V]``, the new hidden state and the weights ``[B, max_length]``.
        """
        embedded = self.dropout(self.embedding(token))  # [B, H]
        attn_weights = F.softmax(self.attn(torch.cat((embedded, hidden[0]), 1)), dim=1)  # [B, max_length]
        values = F.pad(encoder_outputs, (0, 0, 0, self.max_length - encoder_outputs.shape[1]))
        attn_applied = torch.bmm(attn_weights.unsqueeze(1), values).squeeze(1)  # [B, H]
        output = F.relu(self.attn_combine(torch.cat((embedded, attn_applied), 1)))
        output, hidden = self.gru(output.unsqueeze(1), hidden)
        return F.log_softmax(self.out(output.squeeze(1)), dim=1), hidden, attn_weights


class AdditiveAttention(nn.Module):
    """Content-based additive attention (Bahdanau, Cho and Bengio, 2015).

    ``score(s, h_j) = v^T tanh(W s + U h_j)`` compares the decoder state ``s`` with *each encoder
    output* ``h_j``; the softmax over the real (unmasked) positions gives the weights, and the
    context is the weighted sum of the encoder outputs.
    """

    def __init__(self, query_size: int, key_size: int, attn_size: int) -> None:
        super().__init__()
        self.W = nn.Linear(query_size, attn_size, bias=False)
        self.U = nn.Linear(key_size, attn_size)
        self.v = nn.Linear(attn_size, 1, bias=False)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None = None, projected_keys: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query [B, Hq]``, ``keys/values [B, S, H]``, ``mask [B, S]`` (True = real word).

        ``projected_keys`` (``U(keys)``, the same at every decoder step) may be passed to save time.
        Returns the context ``[B, H]`` and the weights ``[B, S]`` (zero where ``mask`` is False).
        """
        if projected_keys is None:
            projected_keys = self.U(keys)
        scores = self.v(torch.tanh(self.W(query).unsqueeze(1) + projected_keys)).squeeze(2)  # [B, S]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores, dim=1)
        return torch.bmm(weights.unsqueeze(1), values).squeeze(1), weights


class AttnDecoderRNN(nn.Module):
    """The course's decoder: a GRU fed [previous word; context], with content-based attention.

    Each step: attend with the previous hidden state, feed the embedded previous word and the
    context to the GRU, and predict the next word from ``tanh(combine([new hidden; context;
    embedded word]))`` (one small layer before the output layer costs less than a wide output layer).
    """

    def __init__(self, hidden_size: int, output_size: int, dropout_p: float = 0.1) -> None:
        super().__init__()
        self.hidden_size, self.output_size = hidden_size, output_size
        self.embedding = nn.Embedding(output_size, hidden_size, padding_idx=PAD_token)
        self.dropout = nn.Dropout(dropout_p)
        self.attention = AdditiveAttention(hidden_size, hidden_size, hidden_size)
        self.gru = nn.GRUCell(2 * hidden_size, hidden_size)  # one step at a time: a cell is faster than nn.GRU
        self.combine = nn.Linear(3 * hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)
        self._keys: torch.Tensor | None = None

    def forward_step(self, token: torch.Tensor, hidden: torch.Tensor, encoder_outputs: torch.Tensor,
                     src_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step, same interface as :meth:`NotesAttnDecoderRNN.forward_step`; weights are ``[B, S]``."""
        embedded = self.dropout(self.embedding(token))  # [B, H]
        keys = self._keys if self._keys is not None else self.attention.U(encoder_outputs)
        context, weights = self.attention(hidden[0], encoder_outputs, encoder_outputs, src_mask, keys)
        state = self.gru(torch.cat((embedded, context), 1), hidden[0])  # [B, H]
        logits = self.out(torch.tanh(self.combine(torch.cat((state, context, embedded), 1))))
        return F.log_softmax(logits, dim=1), state.unsqueeze(0), weights

    def start(self, encoder_outputs: torch.Tensor) -> None:
        """Project the encoder outputs once per sentence (``U h_j`` does not change between steps)."""
        self._keys = self.attention.U(encoder_outputs)

    def stop(self) -> None:
        self._keys = None


class Seq2Seq(nn.Module):
    """Encoder + attention decoder, with teacher forcing for training and greedy decoding."""

    def __init__(self, encoder: EncoderRNN, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor,
                teacher_forcing_ratio: float = 1.0, generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode ``tgt``'s length; returns log-probabilities ``[B, T, V]`` and weights ``[B, T, S']``.

        At each step every sentence of the batch, independently, is fed the true previous word with
        probability ``teacher_forcing_ratio`` and its own prediction otherwise.
        """
        if not 0.0 <= teacher_forcing_ratio <= 1.0:
            raise ValueError(f"teacher_forcing_ratio must be in [0, 1], got {teacher_forcing_ratio}")
        enc_out, hidden = self.encoder(src, src_lengths)
        mask = src != PAD_token
        start = getattr(self.decoder, "start", None)
        if start:
            start(enc_out)
        token = torch.full((src.shape[0],), SOS_token, dtype=torch.long, device=src.device)
        outs, attns = [], []
        try:
            for t in range(tgt.shape[1]):
                log_probs, hidden, weights = self.decoder.forward_step(token, hidden, enc_out, mask)
                outs.append(log_probs)
                attns.append(weights)
                if teacher_forcing_ratio >= 1.0:
                    token = tgt[:, t]
                else:
                    predicted = log_probs.argmax(1)  # argmax is not differentiable: nothing to detach
                    if teacher_forcing_ratio <= 0.0:
                        token = predicted
                    else:
                        coin = torch.rand(token.shape[0], generator=generator, device="cpu").to(src.device)
                        token = torch.where(coin < teacher_forcing_ratio, tgt[:, t], predicted)
        finally:
            if start:
                self.decoder.stop()
        return torch.stack(outs, 1), torch.stack(attns, 1)

    @torch.no_grad()
    def greedy(self, src: torch.Tensor, src_lengths: torch.Tensor, max_length: int = MAX_LENGTH
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding: feed back the most likely word until every sentence has produced EOS.

        Returns tokens ``[B, <=max_length]`` (PAD after EOS) and attention weights ``[B, T, S']``.
        """
        enc_out, hidden = self.encoder(src, src_lengths)
        mask = src != PAD_token
        start = getattr(self.decoder, "start", None)
        if start:
            start(enc_out)
        token = torch.full((src.shape[0],), SOS_token, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        tokens, attns = [], []
        try:
            for _ in range(max_length):
                log_probs, hidden, weights = self.decoder.forward_step(token, hidden, enc_out, mask)
                token = log_probs.argmax(1).masked_fill(done, PAD_token)
                tokens.append(token)
                attns.append(weights)
                done |= token == EOS_token
                if bool(done.all()):
                    break
        finally:
            if start:
                self.decoder.stop()
        return torch.stack(tokens, 1), torch.stack(attns, 1)


def build_model(kind: str, src_lang: Lang, tgt_lang: Lang, hidden_size: int = 128,
                dropout_p: float = 0.1, max_length: int = MAX_LENGTH) -> Seq2Seq:
    """``kind="notes"``: EncoderRNN + NotesAttnDecoderRNN; ``kind="additive"``: EncoderRNN + AttnDecoderRNN."""
    encoder = EncoderRNN(src_lang.n_words, hidden_size)
    if kind == "notes":
        decoder: nn.Module = NotesAttnDecoderRNN(hidden_size, tgt_lang.n_words, dropout_p, max_length)
    elif kind == "additive":
        decoder = AttnDecoderRNN(hidden_size, tgt_lang.n_words, dropout_p)
    else:
        raise ValueError(f"kind must be 'notes' or 'additive', got {kind!r}")
    return Seq2Seq(encoder, decoder)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def train_batch(model: Seq2Seq, batch: Batch, optimizer: torch.optim.Optimizer,
                teacher_forcing_ratio: float = 1.0, clip: float | None = 1.0,
                generator: torch.Generator | None = None) -> float:
    """One optimisation step on a padded batch; returns the mean loss per real target token.

    The loss ignores padding (``ignore_index=PAD_token``), so short sentences are not diluted
    and padded steps do not train the model to predict padding.
    """
    model.train()
    log_probs, _ = model(batch.src, batch.src_lengths, batch.tgt, teacher_forcing_ratio, generator)
    loss = F.nll_loss(log_probs.reshape(-1, log_probs.shape[-1]), batch.tgt.reshape(-1), ignore_index=PAD_token)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item()


def train_pair_notes_style(model: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor,
                           optimizer: torch.optim.Optimizer, max_length: int = MAX_LENGTH) -> float:
    """The notes' ``train()``: one pair, the encoder called word by word, teacher forcing.

    ``src``/``tgt`` are 1-D index tensors ending with EOS. The encoder outputs go into a zero
    ``[max_length, H]`` buffer, exactly as in the notes. Returns the loss per target word.
    """
    model.train()
    encoder, decoder = model.encoder, model.decoder
    hidden = torch.zeros(1, 1, encoder.hidden_size, device=src.device)
    encoder_outputs = torch.zeros(max_length, encoder.hidden_size, device=src.device)
    for ei in range(src.shape[0]):
        output, hidden = encoder.step(src[ei:ei + 1], hidden)
        encoder_outputs[ei] = output[0, 0]
    token = torch.tensor([SOS_token], device=src.device)
    mask = torch.zeros(1, max_length, dtype=torch.bool, device=src.device)
    mask[0, :src.shape[0]] = True
    loss = torch.zeros((), device=src.device)
    for di in range(tgt.shape[0]):
        log_probs, hidden, _ = decoder.forward_step(token, hidden, encoder_outputs.unsqueeze(0), mask)
        loss = loss + F.nll_loss(log_probs, tgt[di:di + 1])
        token = tgt[di:di + 1]  # teacher forcing
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item() / tgt.shape[0]


# --------------------------------------------------------------------------------------------
# Inference and evaluation
# --------------------------------------------------------------------------------------------


def translate(model: Seq2Seq, sentence: str, src_lang: Lang, tgt_lang: Lang,
              max_length: int = MAX_LENGTH) -> tuple[list[str], torch.Tensor]:
    """Translate one sentence greedily; returns the words and the attention ``[T, source words + EOS]``.

    Raises:
        UnknownWordError: the normalised sentence contains words outside ``src_lang``; the message
            names them (the model has no embedding for a word it never saw).
    """
    if not isinstance(sentence, str):
        raise TypeError(f"translate() expects a str, got {type(sentence).__name__}")
    words = normalize_string(sentence)
    ids = src_lang.encode(words, unknown="error")
    device = next(model.parameters()).device
    model.eval()
    tokens, attn = model.greedy(torch.tensor([ids], device=device), torch.tensor([len(ids)]), max_length)
    out = tgt_lang.decode(tokens[0].tolist())
    return out, attn[0, :len(out) + 1, :len(ids)].cpu()


@torch.no_grad()
def translate_batch(model: Seq2Seq, sources: Sequence[str], src_lang: Lang, tgt_lang: Lang,
                    batch_size: int = 256, max_length: int = MAX_LENGTH) -> list[str]:
    """Greedy translations of many normalised sentences (unknown words become ``<unk>``)."""
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    for i in range(0, len(sources), batch_size):
        chunk = list(sources[i:i + batch_size])
        batch = batch_tensors([(s, "") for s in chunk], src_lang, tgt_lang).to(device)
        tokens, _ = model.greedy(batch.src, batch.src_lengths, max_length)
        out.extend(" ".join(tgt_lang.decode(row)) for row in tokens.tolist())
    return out


@dataclass
class Scores:
    bleu: float  # sacrebleu corpus BLEU, 0-100
    exact: float  # fraction of sentences translated exactly
    hypotheses: list[str]


def evaluate(model: Seq2Seq, pairs: Sequence[tuple[str, str]], src_lang: Lang, tgt_lang: Lang) -> Scores:
    """Corpus BLEU (sacrebleu, default 13a tokenisation) and exact-match accuracy on ``pairs``."""
    import sacrebleu

    if not pairs:
        raise ValueError("evaluate() needs at least one pair")
    hyps = translate_batch(model, [a for a, _ in pairs], src_lang, tgt_lang)
    refs = [b for _, b in pairs]
    # the sentences are already tokenised by normalize_string; force=True says so to sacrebleu
    bleu = sacrebleu.corpus_bleu(hyps, [refs], force=True).score
    exact = sum(h == r for h, r in zip(hyps, refs)) / len(refs)
    return Scores(bleu, exact, hyps)
