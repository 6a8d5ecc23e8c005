# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # 05 · Translation with a sequence-to-sequence network and attention (基于注意力的机器翻译)
#
# A **sequence-to-sequence network (序列到序列模型, seq2seq)** turns one sequence into another of a different length:
# here a French sentence into its English translation. A GRU **encoder (编码器)** reads the French words; a GRU
# **decoder (解码器)** writes the English ones, one at a time, each from the words it has written so far; and
# **attention (注意力机制)** lets the decoder look back at the source words while it writes. This is the model of
# PyTorch's classic tutorial *NLP From Scratch: Translation with a Sequence to Sequence Network and Attention*. The
# lesson rebuilds it so that it trains offline in about a minute, and gives a fair answer to the question the
# tutorial raises: *what does attention buy?*
#
# **You will learn to:**
# - prepare a parallel corpus: normalise the text, split it *by sentence* so that no test sentence was seen in
#   training (plus a *compositional* test split of word combinations never seen together), build vocabularies with
#   padding and unknown words, and batch sentences with **padding** (填充) and **packing** (打包);
# - read an attention decoder closely, and tell *location-based* from *content-based* attention with a test;
# - write one decoder with three ways to choose what it reads from the source — no attention, location-based and
#   content-based (Bahdanau) attention — and compare them fairly: same data, budget and initial weights;
# - train with **teacher forcing (教师强制)** as one parallel pass over the target, a masked loss and gradient
#   clipping, and measure it against training the same model on its own predictions;
# - translate by **greedy decoding (贪心解码)** and evaluate: exact match, BLEU (what its clipping and smoothing
#   do), BLEU against sentence length, attention heat maps, and the kinds of sentence each model fails on;
# - practise in four self-checking exercises at the end.
#
# **You should know:** notebooks 01–04 (tensors, autograd, `nn.Module`, a training loop). Recurrent networks are
# new here: section 5 shows what one GRU step computes, by hand and with PyTorch's `nn.GRU`. **Study time:** about 205 min for a first-time
# learner: about 115 to read and run the fifteen sections, 50 for the exercises. Sections 1–10 are the core;
# 11–15 measure what the models learnt and can wait for a second pass. The cells run in one to two minutes on a
# laptop's CPU, most of it training four small models. **On a GPU:** the same code trains on `cuda`, several times
# faster; the stored outputs come from the CPU.
#
# This course grew out of a teacher's study notes for PyTorch 1.x, which end with that tutorial. The lesson stands
# on its own; if you know those notes, the closing section lists what they say that no longer holds.
#
# Every model class, the training step, decoding and evaluation are written in this notebook; `utils/seq2seq.py`
# reads the corpus files and makes batches (section 5 shows the padding it does).

# %%
# Opened alone? (单独打开) In the course's own folder this cell does nothing. Opened alone (in Colab, or
# downloaded without the rest of the course), it fetches the course (its helpers, data and pinned packages) from
# COURSE and runs this notebook inside it.
try:
    import utils.syllabus  # noqa: F401 - the course's helpers: found when this notebook runs in its course
except ModuleNotFoundError:
    import os
    from pathlib import Path
    from urllib.request import urlopen

    COURSE = os.environ.get("TORCH_COURSE_REPOSITORY", "").rstrip("/").removesuffix(".git")
    beside = Path.cwd().parent / "tools" / "opened_alone.py"  # the course is here, but not installed
    if not (beside.is_file() or COURSE):
        raise ModuleNotFoundError(
            "opened without its course, which names no repository to fetch it from: set the environment variable "
            "TORCH_COURSE_REPOSITORY to the course's location (a GitHub address), or get the whole course"
        ) from None
    raw = "/raw/HEAD" if COURSE.startswith("https://github.com/") else ""
    code = beside.read_bytes() if beside.is_file() else urlopen(f"{COURSE}{raw}/tools/opened_alone.py").read()
    exec(code, {"__name__": "opened_alone", "COURSE": COURSE})

# %% tags=["shared"]
import math
import random
import time
from typing import NamedTuple

import sacrebleu
import torch
import torch.nn as nn
import torch.nn.functional as F

from utils.seq2seq import MAX_LENGTH, EOS_token, Lang, PAD_token, SOS_token, normalize_string

assert (PAD_token, SOS_token, EOS_token, MAX_LENGTH) == (0, 1, 2, 13)

# %% [markdown]
# The next cell imports the rest. From the course's `utils` package: `seed_everything(0)` seeds Python's, NumPy's
# and PyTorch's random numbers so that a rerun draws the same ones (notebook 12 explains seeding), `get_device()`
# picks the accelerator if there is one (notebook 01), `plot_curves` draws loss curves and `relpath` shortens a
# path for printing; `is_shipped` tells whether a data file is one the course ships, with its digest in
# `data/SHA256SUMS` (section 1). `tqdm` (a small progress-bar library) draws a text bar under a cell while it trains.
# `sacrebleu` computes BLEU (section 10).
#
# **One CPU thread.** PyTorch splits each operation over several CPU threads, by default one per core. The models
# here are small — a training step is a few hundred operations on matrices of about 80 × 112 numbers — too little
# work to share well. On the course's machines, four threads made a step about twice as fast as one on an idle
# 16-core machine (and sixteen no faster than four), while on a busy two-core machine two threads that kept
# waiting for each other made training about five times *slower* than one. `torch.set_num_threads(1)` keeps this
# notebook on one thread, which is never that slow. On a quiet machine with cores to spare,
# `torch.set_num_threads(4)` trains about twice as fast. (Notebook 11 is about such speed choices.)

# %%
import re  # noqa: E402
import sys  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tools import translation_corpus as tc  # noqa: E402
from utils import get_device, plot_curves, relpath, seed_everything  # noqa: E402
from utils.seq2seq import (  # noqa: E402
    COMPOSITIONAL_FILE,
    CORPUS_FILE,
    ENG_PREFIXES,
    N_COMPOSITIONAL,
    UnknownWordError,
    batch_tensors,
    build_langs,
    filter_pairs,
    make_batches,
    read_compositional,
    read_lines,
    read_pairs,
    split_pairs,
)
from utils.shipped import is_shipped  # noqa: E402

seed_everything(0)
device = get_device()
torch.set_num_threads(1)  # small models: see the paragraph above
print("device:", device.type, "| CPU threads:", torch.get_num_threads())

# %% [markdown]
# ## 1. A corpus that ships
#
# The classic tutorial reads Tatoeba's `eng-fra.txt`: one pair per line, *English TAB French*, of which it keeps the
# pairs whose English side starts with "i am", "he is", "she is", "you are", "we are" or "they are" and whose two
# sides both have fewer than 10 space-separated tokens, punctuation included (about 10,000 pairs). That file cannot be fetched while the course runs, so the course
# **generates** a comparable corpus offline with [pyrealb](https://github.com/lapalme/pyrealb), a **text realiser**
# (文本生成器): you describe a sentence abstractly (subject, verb, object, tense, negation, question) and it writes
# correct French or English, with conjugation, agreement and word order. One abstract sentence, two languages:

# %%
tc.import_pyrealb()  # pyrealb leaves its lexicon files open: this import hides those ResourceWarnings (see its docstring)
from pyrealb import NP, VP, A, D, N, Pro, S, V, loadEn, loadFr  # noqa: E402


def she_sees_black_cats(tense_fr: str, tense_en: str, typ: dict, pronoun: bool = False) -> tuple[str, str]:
    loadFr()  # pyrealb builds and realises in the language loaded last
    cats = NP(D("le"), N("chat"), A("noir")).n("p")
    fr = S(Pro("je").pe(3).g("f"), VP(V("voir"), cats.pro() if pronoun else cats)).t(tense_fr).typ(typ).realize()
    loadEn()
    cats = NP(D("the"), A("black"), N("cat")).n("p")
    en = S(Pro("I").pe(3).g("f"), VP(V("see"), cats.pro() if pronoun else cats)).t(tense_en).typ(typ).realize()
    return fr.strip(), en.strip()


# pyrealb's codes: .pe(3).g("f") third person feminine, .n("p") plural, .pro() the pronoun for that noun phrase;
# tenses .t(): "p" present, "pc" passé composé (French), "ps" simple past (English), "f" future;
# .typ(): {"neg": True} negative, {"int": "yon"} a yes-or-no question
examples = [
    ("p", "p", {}, False),
    ("pc", "ps", {"neg": True}, False),
    ("f", "f", {"int": "yon"}, False),
    ("pc", "ps", {"neg": True}, True),
]
for args in examples:
    fr, en = she_sees_black_cats(*args)
    print(f"{fr:38} {en}")
assert she_sees_black_cats(*examples[3]) == ("Elle ne les a pas vus.", "She did not see them.")

# %% [markdown]
# Look at what changed between the languages: the French adjective follows the noun (*chats noirs* / *black cats*),
# the French object pronoun moves before the verb (*les a vus* / *see them*), and the past participle *vus* agrees
# with that preceding plural object. A real translation problem has more than word order, so the grammar in
# `tools/translation_corpus.py`, the course's corpus generator (course tooling in `tools/`, not a lesson helper: this
# notebook imports it as `tc` only to show its grammar, and reads the corpus with `utils.seq2seq`), also writes:
#
# | phenomenon | French | English |
# |---|---|---|
# | idioms | j'ai faim · il fait froid · il pleut · j'ai dix ans | i am hungry · it is cold · it is raining · i am ten years old |
# | role swap | tu me manques | i miss you |
# | possessor moves | le chien de ma sœur | my sister's dog |
# | past: states in the imparfait, events in the passé composé | il était fatigué · elle avait faim · il a vu le chat | he was tired · she was hungry · he saw the cat |
# | English preposition from nowhere | je cherche la clé · j'attends le bus | i look for the key · i wait for the bus |
# | agreement, determiners, possessives | elles sont fatiguées · mon/ma/mes | they are tired · my |
# | negation | je ne vois pas de chat | i do not see a cat |
# | questions | a-t-elle vu le chat ? · où est mon chat ? | did she see the cat ? · where is my cat ? |
#
# The generator draws 24,000 distinct pairs (seeded, deterministic; `python -m tools.translation_corpus` rewrites the
# same bytes) into `data/eng-fra-course.txt`, in Tatoeba's format. It also keeps sentences plausible (no four-year-old
# father, no fast banana, no *the alone cat*). A second file holds the **compositional test split (组合泛化测试集)**:
# 1,000 pairs that each contain a combination never seen in the first file — an adjective with a noun (*bleu* +
# *vélo*), a verb with an object pronoun (*voir*: *je la vois*, "I see her", is never in training), a name in a
# question, a city after a verb. Its third column names the held-out combination, the way Tatoeba's own files carry
# an attribution column. `read_lines` checks both files against their SHA-256 digests in `data/SHA256SUMS` before
# reading a line: a damaged file (one flipped bit turns *chair* into *bhair*, and a reader alone would not notice)
# stops with an error that names it and says how to restore it.

# %%
for path in (CORPUS_FILE, COMPOSITIONAL_FILE):
    lines = read_lines(path)  # checks the file against data/SHA256SUMS first
    print(f"{relpath(path)}: {len(lines)} lines, {path.stat().st_size / 1e6:.2f} MB")
    for line in lines[:2]:
        print("   ", line.replace("\t", " <TAB> "))
assert len(lines) == N_COMPOSITIONAL and CORPUS_FILE.stat().st_size < 3e6
assert all(is_shipped(p) for p in (CORPUS_FILE, COMPOSITIONAL_FILE))  # listed in data/SHA256SUMS: checked
assert ord("c") ^ ord("b") == 0b1  # c -> b: one bit

# %% [markdown]
# ## 2. Normalisation and loading
#
# The tutorial's `normalizeString` lower-cases, turns Unicode into ASCII by dropping accents (`unicodeToAscii`), puts
# a space before `.!?` and replaces every other non-letter by a space. One flaw: `œ` is a letter of its own, not `o`
# plus a mark, so it is dropped and *sœur* becomes *s ur*. `utils.seq2seq.normalize_string` spells ligatures out
# first.

# %%
import unicodedata  # noqa: E402


def classic_normalize(s: str) -> str:  # the tutorial's unicodeToAscii + normalizeString
    s = "".join(c for c in unicodedata.normalize("NFD", s.lower().strip()) if unicodedata.category(c) != "Mn")
    s = re.sub(r"([.!?])", r" \1", s)
    return re.sub(r"[^a-zA-Z.!?]+", r" ", s)


sentence = "Ma sœur n'est-elle pas là ?"
print("classic:", repr(classic_normalize(sentence)))
print("course: ", repr(normalize_string(sentence)))
assert (
    classic_normalize(sentence) == "ma s ur n est elle pas la ?"
    and normalize_string(sentence) == "ma soeur n est elle pas la ?"
)

# %% [markdown]
# `read_pairs` does what the tutorial's `readLangs` does: it reads the tab-separated file, normalises both sides and,
# with `reverse=True`, returns *(French, English)* pairs, because French is the source. `filter_pairs` is the
# tutorial's `filterPairs`: fewer than `MAX_LENGTH` = 13 tokens per side (12 words and punctuation, plus room for the
# end token), optionally only pairs whose English side starts with one of the tutorial's `eng_prefixes`.
#
# **Using the real Tatoeba file.** Download `fra-eng.zip` from <https://www.manythings.org/anki/>, unzip `fra.txt`
# to `data/eng-fra.txt`, and replace the corpus path below by `DATA_DIR / "eng-fra.txt"`; add
# `prefixes=ENG_PREFIXES` (and `max_length=10`) to get the tutorial's ~10,000 pairs. The third column of that file
# (the attribution) is ignored.

# %%
pairs = filter_pairs(read_pairs(CORPUS_FILE, reverse=True))
print(len(pairs), "pairs, e.g.", random.Random(1).choice(pairs))
fra_words = {w for fr, _ in pairs for w in fr.split()}
eng_words = {w for _, en in pairs for w in en.split()}
longest = max(len(s.split()) for p in pairs for s in p)
print(f"{len(fra_words)} French and {len(eng_words)} English word types; longest sentence: {longest} tokens")
tutorial_like = filter_pairs(pairs, prefixes=ENG_PREFIXES)
print(f"{len(tutorial_like)} pairs pass the tutorial's 'i am / he is / ...' filter")
assert len(pairs) == 24_000 and len(fra_words) >= 300 and len(eng_words) >= 300 and longest == 12

# %% [markdown]
# A few pairs of each kind (found by pattern in the corpus, so you can see these are not made up for the notebook;
# normalisation turns the apostrophe into a space, so *my teachers' sons* reads *my teachers sons*):

# %%
patterns = {
    "adjective after noun": r"^\w+ \w+ (le|la|les) \w+ (noir|rouge|vert|bleu)e?s? \.$",
    "object pronoun": r"^(je|il|elle) (la|les|le) \w+ \.$",
    "possessor moves": r"^(le|la|les) \w+ de (mon|ma|mes) \w+ ",
    "avoir faim": r"^(j ai|il a|elle a) faim \.$",
    "il fait": r"^il fait \w+ \.$",
    "il pleut": r"^il pleut",
    "imparfait": r"^(il|elle) etait \w+ \.$",
    "tu me manques": r"^tu me manques",
    "question": r"^a t (il|elle) \w+ ",
}
for name, pattern in patterns.items():
    fr, en = next(p for p in pairs if re.search(pattern, p[0]))
    print(f"{name:21} {fr:40} -> {en}")

# %% [markdown]
# ## 3. Train, validation and test splits
#
# The **training set (训练集)** fits the weights, the **validation set (验证集)** checks a model while you develop it
# (section 9), and each **test set (测试集)** is used only to report the final scores. `split_pairs` splits **by
# sentence**: pairs that share a French or an English sentence (*tu es fatigué* and *vous êtes fatigué* are both *you
# are tired*) go to the same split, so no test sentence, on either side, was seen in training. (It links the pairs
# that share a sentence into groups, then deals whole groups out to the three splits.) The random split measures
# how well the model generalises to new sentences from the same distribution; the compositional split measures
# something harder.

# %%
train, val, test = split_pairs(pairs, (0.8, 0.1, 0.1), seed=0)
comp_rows = read_compositional()
comp = [(fr, en) for fr, en, _ in comp_rows]
print(f"train {len(train)}, validation {len(val)}, random test {len(test)}, compositional test {len(comp)}")
train_src, train_tgt = {a for a, _ in train}, {b for _, b in train}
assert not train_src & {a for a, _ in val + test} and not train_tgt & {b for _, b in val + test}
assert not train_src & {a for a, _ in comp}

# %% [markdown]
# A split by *pair* would leak: an English sentence with several French sources would often have one source in
# training and another in the test set, and the model would be tested on a sentence it has already learnt to write.
# Here every group of pairs sharing an English sentence lies in one split:

# %%
split_of = {p: name for name, part in (("train", train), ("validation", val), ("test", test)) for p in part}
sources: dict[str, list[str]] = {}
for fr, en in pairs:
    sources.setdefault(en, []).append(fr)
several = {en: frs for en, frs in sources.items() if len(frs) > 1}
print(f"{len(several)} English sentences have several French sources; each group lies in one split")
en, frs = next((en, frs) for en, frs in sorted(several.items()) if len(frs) >= 3 and split_of[frs[0], en] == "test")
print(f"e.g. {en!r}, all in the test split:", frs)
assert all(len({split_of[fr, en] for fr in frs}) == 1 for en, frs in several.items()) and len(several) > 100

# %% [markdown]
# What "never seen together" means, on one example: *bleu* (blue) and *vélo* (bicycle) are both common in training,
# but never in the same noun phrase; the compositional split has them together.

# %%
blue_bicycle = re.compile(r"\bvelos? bleus?\b")
print(
    "training sentences with 'velo':",
    sum(re.search(r"\bvelos?\b", a) is not None for a, _ in train),
    "| with 'bleu':",
    sum(re.search(r"\bbleue?s?\b", a) is not None for a, _ in train),
    "| with 'velo(s) bleu(s)':",
    sum(blue_bicycle.search(a) is not None for a, _ in train),
)
example = next((fr, en, cats) for fr, en, cats in comp_rows if blue_bicycle.search(fr))
print("compositional:", example)
assert not any(blue_bicycle.search(a) for a, _ in train)
assert tc.is_held_out(("verb+pronoun", "voir")) and "je la vois ." not in train_src

# %% [markdown]
# ## 4. The vocabulary: `Lang`
#
# `Lang` is the tutorial's **vocabulary (词表)** class: `word2index`, `word2count`, `index2word`. Two additions that
# batching and real use need: index 0 is **padding** (`<pad>`; `nn.Embedding(padding_idx=0)` keeps its row at zero and
# never updates it, while packing and the loss's `ignore_index`, below, are what keep padding out of the computation),
# and words the model never saw raise a clear error (or map to `<unk>` when you ask for it). The special tokens
# `<sos>`, `<eos>` and `<unk>` are a sentence's **start token** (起始标记) and **end token** (结束标记), and the token
# of an **unknown word** (未知词).
# Vocabularies are built from the **training** pairs only: a word that appears only in the test set is, honestly,
# unknown. Of the corpus's 1039 French word types (section 2), 4 occur only outside the training split, so the French
# vocabulary holds 1035 words, plus the 4 special tokens: 1039 indices, by coincidence the same number.

# %%
input_lang, output_lang = build_langs(train, "fra", "eng")
print(f"{input_lang.name}: {input_lang.n_words} indices, {output_lang.name}: {output_lang.n_words} indices")
print("specials:", [input_lang.index2word[i] for i in (PAD_token, SOS_token, EOS_token, 3)])
ids = input_lang.encode("elle a faim .")
print("encode('elle a faim .') ->", ids, "-> decode ->", input_lang.decode(ids))
try:
    input_lang.encode("elle mange un croissant .")
except UnknownWordError as err:
    print(type(err).__name__ + ":", err)
assert ids[-1] == EOS_token and input_lang.decode(ids) == ["elle", "a", "faim", "."]

# %% [markdown]
# ## 5. Batches: padding and packing
#
# The classic tutorial trains on **one pair at a time**, which keeps every tensor `[1, 1, 256]` and the code simple,
# and leaves the CPU (let alone a GPU) idle most of the time. A **batch (批量)** puts many sentences side by side;
# sentences differ in length, so the shorter ones are padded with index 0 up to the longest. `batch_tensors`
# encodes a list of pairs (each sentence ends with `<eos>`) and pads them:

# %%
demo_pairs = [next(p for p in train if len(p[0].split()) == n) for n in (6, 4, 5)]
batch = batch_tensors(demo_pairs, input_lang, output_lang)
for fr, en in demo_pairs:
    print(f"{fr:22} -> {en}")
print("src:\n", batch.src, "\nlengths:", batch.src_lengths.tolist(), "\ntgt:\n", batch.tgt)
assert (batch.src == PAD_token).sum() == sum(batch.src.shape[1] - n for n in batch.src_lengths.tolist())

# %% [markdown]
# There is no more to padding than that: `nn.utils.rnn.pad_sequence` stacks tensors of different lengths into one,
# filling the end of the shorter ones with `padding_value`, and gives the same tensor:

# %%
encoded = [torch.tensor(input_lang.encode(fr)) for fr, _ in demo_pairs]
by_hand = nn.utils.rnn.pad_sequence(encoded, batch_first=True, padding_value=PAD_token)
print("lengths", [len(x) for x in encoded], "-> padded", tuple(by_hand.shape), "| equal to batch.src:", end=" ")
print(torch.equal(by_hand, batch.src))
assert torch.equal(by_hand, batch.src)

# %% [markdown]
# Padding is wasted work: the embeddings, the decoder and attention compute on every padded position, only to throw
# the result away (the encoder's GRU, fed a packed batch, skips them).
# `make_batches` therefore **buckets** sentences by length: it shuffles the pairs, sorts them by source length
# inside chunks of 50 batches, cuts the chunks into batches and shuffles the batches. Each batch then holds
# sentences of nearly the same length, and each epoch still sees them in a new order:

# %%
shuffled = train.copy()
random.Random(0).shuffle(shuffled)
plain = [batch_tensors(shuffled[i : i + 80], input_lang, output_lang) for i in range(0, len(shuffled), 80)]
bucketed = make_batches(train, input_lang, output_lang, 80, random.Random(0))


def padding_share(batches) -> float:
    return sum(int((b.src == PAD_token).sum()) for b in batches) / sum(b.src.numel() for b in batches)


print(f"{len(plain)} batches of 80: {padding_share(plain):.0%} of the source positions are padding in random batches,")
print(f"{len(bucketed)} batches of 80: {padding_share(bucketed):.0%} with length buckets")
assert padding_share(plain) > 0.3 and padding_share(bucketed) < 0.03

# %% [markdown]
# **What a GRU computes.** A **recurrent network** (循环神经网络) reads a sequence one step at a time and carries a
# **hidden state** (隐藏状态) $h$ from step to step: a vector of `H` numbers that summarises what it has read so far.
# A **GRU** (gated recurrent unit, 门控循环单元) computes the new state from the input $x_t$ and the old state
# $h_{t-1}$ with two gates, numbers between 0 and 1 made by a sigmoid $\sigma$:
#
# - the **reset gate** $r = \sigma(W_{ir} x_t + b_{ir} + W_{hr} h_{t-1} + b_{hr})$ decides how much of the old state
#   enters the candidate;
# - the **update gate** $z = \sigma(W_{iz} x_t + b_{iz} + W_{hz} h_{t-1} + b_{hz})$ decides how much of the old state
#   to keep;
# - the **candidate** $n = \tanh(W_{in} x_t + b_{in} + r \odot (W_{hn} h_{t-1} + b_{hn}))$ is the proposed new state;
# - the **new state** is $h_t = (1 - z) \odot n + z \odot h_{t-1}$, a per-number mix of candidate and old state.
#
# PyTorch stacks the three input matrices $W_{ir}, W_{iz}, W_{in}$ into one `weight_ih` of `3H` rows (and likewise
# `weight_hh` and the two biases), so one matrix product computes all three at once: an `nn.GRU(H, H)` has
# $2 \times (3H \cdot H + 3H)$ parameters. `nn.GRUCell` computes one step; `nn.GRU` computes the same step for
# every position of a sequence inside one call (in optimised C++ code, not a Python loop). The cell below computes
# a step by hand, then checks that looping a `GRUCell` with the same weights gives what one `nn.GRU` call gives:

# %%
torch.manual_seed(0)
H = 4
gru = nn.GRU(H, H, batch_first=True)
print({name: tuple(p.shape) for name, p in gru.named_parameters()})  # 3H = 12 rows: r, z and n stacked


def gru_step(x_t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One GRU step by hand, with ``gru``'s weights: ``x_t [B, H]``, ``h [B, H]`` -> new state ``[B, H]``."""
    i_r, i_z, i_n = (x_t @ gru.weight_ih_l0.T + gru.bias_ih_l0).chunk(3, dim=-1)  # rows in the order r, z, n
    h_r, h_z, h_n = (h @ gru.weight_hh_l0.T + gru.bias_hh_l0).chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)  # reset gate
    z = torch.sigmoid(i_z + h_z)  # update gate
    n = torch.tanh(i_n + r * h_n)  # candidate
    return (1 - z) * n + z * h  # new hidden state


cell = nn.GRUCell(H, H)
with torch.no_grad():  # give the cell the GRU's weights
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(cell, name).copy_(getattr(gru, name + "_l0"))
x = torch.randn(2, 5, H)  # 2 sequences of 5 steps
with torch.no_grad():
    outputs_gru, final_gru = gru(x)  # all 5 steps in one call
    h_cell = h_hand = torch.zeros(2, H)  # the initial state is zero
    for t in range(5):
        h_cell, h_hand = cell(x[:, t], h_cell), gru_step(x[:, t], h_hand)
torch.testing.assert_close(h_hand, h_cell)  # the formulas above are what GRUCell computes
torch.testing.assert_close(h_cell, final_gru[0])  # looping GRUCell = one nn.GRU call
torch.testing.assert_close(outputs_gru[:, -1], final_gru[0])  # the output at the last step is the final state
print("outputs", tuple(outputs_gru.shape), "final state", tuple(final_gru.shape))
print("by hand = GRUCell looped over 5 steps = nn.GRU in one call (within float rounding)")
assert sum(p.numel() for p in gru.parameters()) == 2 * (3 * H * H + 3 * H)

# %% [markdown]
# The encoder must not read the padding: a GRU that ran over two `<pad>` steps would end in a different hidden state
# than the sentence alone (shown below). `nn.utils.rnn.pack_padded_sequence` tells the GRU each sentence's
# length, so it stops at the right step (`enforce_sorted=False`: the batch need not be sorted by length; it sorts
# and unsorts for you); `pad_packed_sequence` returns zero vectors for the padded positions (`total_length`: padded
# back to the batch's full width, so shapes match the input). The
# encoder is the tutorial's `EncoderRNN` (a word **embedding (词嵌入)** of size `hidden_size`, one GRU layer) with that
# change, reading the whole batch in one call instead of one word per call. Two layers are at work:
# `nn.Embedding(V, H)` is a learnt table of `V` rows of `H` numbers, and indexing it with word indices gives each
# word's vector; `nn.GRU(H, H, batch_first=True)`, the layer above, reads a `[B, S, H]` batch and returns its output at every step,
# `[B, S, H]`, and its final hidden state, `[1, B, H]` (one layer).


# %% tags=["shared"]
class Encoder(nn.Module):
    """The tutorial's EncoderRNN, reading a padded batch in one call (packed, so padding never updates the state)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(vocab_size, hidden_size, padding_idx=PAD_token)  # <pad> stays a zero vector
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)

    def forward(self, src: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``src [B, S]`` -> outputs ``[B, S, H]`` (zeros at padding) and the final state ``[1, B, H]``."""
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(src), lengths.cpu(), batch_first=True, enforce_sorted=False
        )  # lengths must be on the CPU
        outputs, hidden = self.gru(packed)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True, total_length=src.shape[1])
        return outputs, hidden


assert Encoder(10, 4)(torch.tensor([[5, EOS_token, PAD_token]]), torch.tensor([2]))[0].shape == (1, 3, 4)

# %%
torch.manual_seed(0)
encoder = Encoder(input_lang.n_words, 16)
outputs, hidden = encoder(batch.src, batch.src_lengths)
short = int(batch.src_lengths.argmin())
n = int(batch.src_lengths[short])
alone_out, alone_hidden = encoder(batch.src[short : short + 1, :n], batch.src_lengths[short : short + 1])
torch.testing.assert_close(hidden[:, short], alone_hidden[:, 0])  # padding did not touch the final state
torch.testing.assert_close(outputs[short, n - 1], hidden[0, short])  # the last real output IS the final state
assert torch.all(outputs[short, n:] == 0)
_, unpacked_hidden = encoder.gru(encoder.embedding(batch.src[short : short + 1]))  # the GRU run over the <pad> too
drift = (unpacked_hidden[0, 0] - alone_hidden[0, 0]).abs().max().item()
print("outputs", tuple(outputs.shape), "hidden", tuple(hidden.shape))
print("padded outputs are zero; final state = the sentence alone = the output at its last real word")
print(f"without packing, {batch.src.shape[1] - n} <pad> steps move the final state by up to {drift:.1f}")
assert drift > 0.01

# %% [markdown]
# The last check matters below: for a one-layer, one-directional GRU the output at a sentence's last real word
# (its `<eos>`) *is* the final hidden state, the encoder's summary of the whole sentence. In a padded batch that
# holds only when the GRU was packed; without packing, the final state has read the padding too.
#
# ## 6. The classic attention decoder scores positions, not the words at them
#
# Here is the tutorial's `AttnDecoderRNN`, batched (one step for a whole batch; otherwise line for line the
# tutorial's `forward`, plus the check on the source length explained below). The tutorial runs the encoder word by
# word into a zero buffer of `max_length` rows, `encoder_outputs = torch.zeros(max_length, hidden_size)`; `F.pad`
# builds the same buffer for a batch: `F.pad(x, (0, 0, 0, n))` adds `n` zero rows at the end of dimension 1 of
# `x [B, S, H]` (the amounts come in pairs, before and after, starting from the last dimension):


# %% tags=["shared"]
def check_source_length(positions: int, max_length: int) -> None:
    """Location-based attention has one score per position up to max_length: refuse a longer source."""
    if positions > max_length:
        raise ValueError(
            f"{positions} source positions, but this location-based attention scores only "
            f"max_length={max_length}: the rest would get no weight. Keep sources within max_length "
            "(filter_pairs) or build the attention with a larger max_length"
        )


class ClassicAttnDecoderRNN(nn.Module):
    """The classic tutorial's AttnDecoderRNN, one step for a batch: attention weights from [previous word; state]."""

    def __init__(self, hidden_size: int, output_size: int, dropout_p: float = 0.1, max_length: int = MAX_LENGTH):
        super().__init__()
        self.max_length = max_length
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attn = nn.Linear(hidden_size * 2, max_length)  # one score per source *position*
        self.attn_combine = nn.Linear(hidden_size * 2, hidden_size)
        self.dropout = nn.Dropout(dropout_p)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)

    def forward(self, token, hidden, encoder_outputs):
        check_source_length(encoder_outputs.shape[1], self.max_length)  # F.pad below would crop a longer one
        embedded = self.dropout(self.embedding(token))  # [B, H]
        attn_weights = F.softmax(self.attn(torch.cat((embedded, hidden[0]), 1)), dim=1)  # [B, max_length]
        padded = F.pad(encoder_outputs, (0, 0, 0, self.max_length - encoder_outputs.shape[1]))  # the zero buffer
        attn_applied = torch.bmm(attn_weights.unsqueeze(1), padded).squeeze(1)  # [B, H]
        output = F.relu(self.attn_combine(torch.cat((embedded, attn_applied), 1)))
        output, hidden = self.gru(output.unsqueeze(1), hidden)
        return F.log_softmax(self.out(output.squeeze(1)), dim=1), hidden, attn_weights


assert ClassicAttnDecoderRNN(8, 20).attn.out_features == MAX_LENGTH

# %% [markdown]
# The attention weights come from `self.attn(cat(embedded, hidden))`: a linear layer from the previous word and the
# decoder state to **`max_length` scores, one per source position**: **location-based attention (基于位置的注意力)**,
# in the terms of Luong, Pham & Manning (2015). The encoder outputs enter only *after* the weights are fixed, when
# `bmm` averages them. The weights are not independent of the source — the decoder state starts from the encoder's
# final state, which summarises the whole sentence, so another sentence gives other weights — but the score of
# position 3 never looks at the word *at* position 3. The decoder can learn "after writing *i*, look at position 3",
# and guess positions from its summary of the sentence; it cannot *search* for the word that means *black*. And
# since the softmax runs over all `max_length` slots, some weight lands on slots past the end of the sentence, where
# the zero buffer holds nothing. The cell below checks all three facts (the claim, in many blog posts, that such
# attention is "blind to the source" is too strong).
#
# The other way round, a source longer than `max_length` has no slots for its last positions. The tutorial's
# word-by-word loop fails with an `IndexError` when a sentence has more words than its buffer has rows; the batched
# buffer fails silently: the padding `max_length - S` turns negative, and `F.pad` with a negative amount *crops*, so every position
# past the 13th would get no weight (raise the length filter and you would never know). `check_source_length`
# refuses such a source instead, here and in section 7's location-based attention.

# %%
torch.manual_seed(0)
classic_dec = ClassicAttnDecoderRNN(16, output_lang.n_words, dropout_p=0.0).eval()
enc_out = torch.randn(1, 5, 16)  # five source positions
perm = torch.tensor([3, 0, 4, 1, 2])
h0 = torch.randn(1, 1, 16)
_, _, w_original = classic_dec(torch.tensor([SOS_token]), h0, enc_out)
_, _, w_shuffled = classic_dec(torch.tensor([SOS_token]), h0, enc_out[:, perm])  # same outputs, other order
_, _, w_other_state = classic_dec(torch.tensor([SOS_token]), -h0, enc_out)  # another sentence's state
torch.testing.assert_close(w_original, w_shuffled)  # the words at the positions do not enter the scores
moved = (w_original - w_other_state).abs().sum().item() / 2  # weight that moves to other slots
beyond = w_original[0, 5:].sum().item()
print(f"weights over {w_original.shape[1]} slots for a 5-word source")
print("weights after permuting the encoder outputs: unchanged (assert_close)")
print(f"share of the weight that moves when the decoder state changes: {moved:.2f}")
print(f"weight on the slots past the sentence: {beyond:.1f}")
assert moved > 0.05 and beyond > 0.3
too_long = torch.randn(1, MAX_LENGTH + 2, 16)
assert F.pad(too_long, (0, 0, 0, -2)).shape == (1, MAX_LENGTH, 16)  # a negative pad crops the last two positions
refused = False
try:
    classic_dec(torch.tensor([SOS_token]), h0, too_long)
except ValueError as err:
    refused = True
    print("ValueError:", err)
assert refused  # check_source_length, not a silent crop

# %% [markdown]
# ## 7. One decoder, three ways to choose the context (上下文)
#
# To see what attention buys, and what *kind* of attention, the three models below share everything — encoder,
# decoder, sizes, data, batches, optimiser, number of steps, even the initial weights — except the function that
# turns the decoder state into weights over the source positions:
#
# | model | weights $\alpha_t$ over the source positions $j$ | extra parameters |
# |---|---|---|
# | **no attention** (Cho et al. 2014, who feed this summary at every step; Sutskever et al. 2014 only start the decoder from it) | all on the last word: the context is the encoder's final state, the same at every step | none |
# | **location-based** (Luong et al. 2015) | $\operatorname{softmax}_j(W_a s_t)_j$: the state alone scores *positions*, as in section 6 | $(H + 1) \times$ `max_length` |
# | **content-based additive attention** (基于内容的加性注意力; Bahdanau et al. 2015) | $\operatorname{softmax}_j\big(v^\top \tanh(W s_t + U h_j)\big)$: the state compared with what is *at* $j$ | $2H^2 + 2H$ |
#
# Here $s_t$ is the decoder's state at step $t$, $h_j$ the encoder's output at source position $j$, and $H$ the hidden
# size (112).
#
# In all three the **context vector (上下文向量)** is $c_t = \sum_j \alpha_{tj} h_j$, and the next word is predicted from
# $\tanh(W_c [s_t; c_t])$. Padded positions get weight exactly 0: their scores are set to $-\infty$ before the
# softmax, a **masked softmax (掩码 softmax)** (the classic decoder of section 6 spreads weight past the end; here it cannot).
# `scores.masked_fill(mask, value)` returns a copy of `scores` with `value` wherever `mask` is True.
#
# The decoder follows Luong et al.'s **global attention (全局注意力)** — attention over every source position — in its
# simplest form: the GRU step comes first, then attention reads the source with the new state $s_t$. The classic
# decoder (and Bahdanau's, and the tutorial's 2023 rewrite) do it the other way round — attend with the previous
# state, then feed the context into the GRU. Luong et al.'s best models also feed each step's attentional output into the next step's input (*input
# feeding*); we leave it out, and that has a large practical consequence: the GRU no longer depends on attention, so
# during training, when the decoder's inputs are the true previous words, **the GRU runs
# over the whole target sentence in one call**, and attention for all steps is one batched tensor expression. Only
# greedy decoding, which must feed back its own words, goes one step at a time — through the same `forward`, with
# `T = 1`.


# %% tags=["shared"]
def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over source positions of ``scores [B, T, S]``; positions where ``mask [B, S]`` is False get 0."""
    return F.softmax(scores.masked_fill(~mask.unsqueeze(1), float("-inf")), dim=-1)


class NoAttention(nn.Module):
    """No attention: all the weight on the sentence's last word, whose encoder output is the final state."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()  # no parameters: hidden_size is accepted for a common interface

    def forward(self, states: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        last = mask.sum(1) - 1  # position of each sentence's <eos>
        weights = F.one_hot(last, keys.shape[1]).to(keys.dtype)  # [B, S]
        return weights.unsqueeze(1).expand(-1, states.shape[1], -1)  # the same at every step: [B, T, S]


class LocationAttention(nn.Module):
    """Location-based attention (Luong et al. 2015): the decoder state alone scores each source *position*."""

    def __init__(self, hidden_size: int, max_length: int = MAX_LENGTH) -> None:
        super().__init__()
        self.score = nn.Linear(hidden_size, max_length)

    def forward(self, states: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        check_source_length(keys.shape[1], self.score.out_features)
        return masked_softmax(self.score(states)[..., : keys.shape[1]], mask)  # keys are not used


class ContentAttention(nn.Module):
    """Additive content-based attention (Bahdanau et al. 2015): v . tanh(W s_t + U h_j) for every position j."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.W = nn.Linear(hidden_size, hidden_size, bias=False)
        self.U = nn.Linear(hidden_size, hidden_size)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, states: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # [B, T, 1, A] + [B, 1, S, A] broadcasts to [B, T, S, A]: every step against every source word at once
        scores = self.v(torch.tanh(self.W(states).unsqueeze(2) + self.U(keys).unsqueeze(1))).squeeze(-1)
        return masked_softmax(scores, mask)  # [B, T, S]


ATTENTION = {"none": NoAttention, "location": LocationAttention, "content": ContentAttention}


class Decoder(nn.Module):
    """One GRU decoder for all three models (Luong et al.'s global attention); only ``attention`` differs."""

    def __init__(self, vocab_size: int, hidden_size: int, attention: str, dropout_p: float = 0.1) -> None:
        super().__init__()
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {sorted(ATTENTION)}, got {attention!r}")
        self.embedding = nn.Embedding(vocab_size, hidden_size, padding_idx=PAD_token)
        self.dropout = nn.Dropout(dropout_p)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.combine = nn.Linear(2 * hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, vocab_size)
        self.attention = ATTENTION[attention](hidden_size)  # made last: the other weights start equal in all three

    def forward(
        self, previous: torch.Tensor, hidden: torch.Tensor, encoder_outputs: torch.Tensor, src_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``previous [B, T]`` words -> logits ``[B, T, V]``, last state ``[1, B, H]``, weights ``[B, T, S]``."""
        states, hidden = self.gru(self.dropout(self.embedding(previous)), hidden)  # all T steps in one call
        weights = self.attention(states, encoder_outputs, src_mask)
        context = weights @ encoder_outputs  # [B, T, S] @ [B, S, H] -> [B, T, H]
        logits = self.out(torch.tanh(self.combine(torch.cat((states, context), -1))))
        return logits, hidden, weights


assert (
    sum(p.numel() for p in Decoder(20, 8, "none").parameters())
    == 20 * 8 + 2 * (3 * 8 * 8 + 3 * 8) + 16 * 8 + 8 + 8 * 20 + 20
)

# %% [markdown]
# The content-based weights follow the content: permute the encoder outputs $h_j$ and the weights are permuted the
# same way. The location-based weights stay on the same positions, whatever stands there. (This permutes the
# encoder's outputs, not the French words: a recurrent encoder given the words in another order would compute other
# $h_j$.) And a padded position gets zero
# weight in both:

# %%
torch.manual_seed(0)
states = torch.randn(1, 1, 16)  # one decoder state
mask = torch.ones(1, 5, dtype=torch.bool)
for name in ("content", "location"):
    attention = ATTENTION[name](16)
    w = attention(states, enc_out, mask)[0, 0]
    w_perm = attention(states, enc_out[:, perm], mask)[0, 0]
    follows = torch.allclose(w_perm, w[perm])
    print(
        f"{name:8} weights {[round(x, 2) for x in w.tolist()]}, permuted outputs {[round(x, 2) for x in w_perm.tolist()]}:",
        "they follow the words" if follows else "they stay on the positions",
    )
    assert follows == (name == "content")
    padded = attention(states, enc_out, torch.tensor([[True, True, True, False, False]]))
    assert torch.all(padded[0, 0, 3:] == 0) and torch.isclose(padded.sum(), torch.tensor(1.0))
print("weights on padded positions: 0 for both")

# %% [markdown]
# `Seq2Seq` puts an encoder and a decoder together. In training, the decoder's input at step $t$ is the **true**
# word $t - 1$ (and `<sos>` first): the target shifted right by one. That is teacher forcing (教师强制), and it is
# what lets the decoder's GRU run over all steps at once. `greedy` decodes without a target: it feeds back its own most
# likely word, one step at a time, until every sentence of the batch has written `<eos>`.


# %% tags=["shared"]
class Seq2Seq(nn.Module):
    def __init__(self, encoder: Encoder, decoder: Decoder) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing: logits ``[B, T, V]`` for ``tgt [B, T]``, the decoder reading <sos> + tgt shifted right."""
        encoder_outputs, hidden = self.encoder(src, src_lengths)
        previous = torch.cat((torch.full_like(tgt[:, :1], SOS_token), tgt[:, :-1]), 1)
        logits, _, weights = self.decoder(previous, hidden, encoder_outputs, src != PAD_token)
        return logits, weights

    @torch.no_grad()
    def greedy(
        self, src: torch.Tensor, src_lengths: torch.Tensor, max_length: int = MAX_LENGTH
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding: words ``[B, <=max_length]`` (PAD after <eos>) and attention weights ``[B, T, S]``."""
        if max_length < 1:
            raise ValueError(f"max_length must be at least 1, got {max_length}: the number of words to write at most")
        encoder_outputs, hidden = self.encoder(src, src_lengths)
        mask = src != PAD_token
        word = torch.full((src.shape[0], 1), SOS_token, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        words, weights = [], []
        for _ in range(max_length):
            logits, hidden, w = self.decoder(word, hidden, encoder_outputs, mask)  # one step: T = 1
            word = logits.argmax(-1).masked_fill(done.unsqueeze(1), PAD_token)
            words.append(word)
            weights.append(w)
            done |= word[:, 0] == EOS_token
            if done.all():
                break
        return torch.cat(words, 1), torch.cat(weights, 1)


def build_model(
    attention: str, src_lang: Lang, tgt_lang: Lang, hidden_size: int = 112, dropout_p: float = 0.1
) -> Seq2Seq:
    """Encoder + decoder with ``attention`` = "none", "location" or "content"."""
    return Seq2Seq(Encoder(src_lang.n_words, hidden_size), Decoder(tgt_lang.n_words, hidden_size, attention, dropout_p))


assert Seq2Seq.forward.__doc__.startswith("Teacher forcing")

# %% [markdown]
# Built from the same seed, the three models start with identical weights everywhere except in the attention score,
# and the no-attention model's context at every step is exactly the encoder's final state:

# %%
models = {}
for name in ATTENTION:
    seed_everything(0)
    models[name] = build_model(name, input_lang, output_lang, hidden_size=16, dropout_p=0.0).eval()
shared = models["none"].state_dict()
for name, model in models.items():
    own = {k: v for k, v in model.state_dict().items() if ".attention." in k}
    same = all(torch.equal(v, model.state_dict()[k]) for k, v in shared.items())
    print(
        f"{name:8} attention parameters: {sum(v.numel() for v in own.values()):5d}"
        f" | all other weights equal to the no-attention model's: {same}"
    )
    assert same
enc_outputs, enc_hidden = models["none"].encoder(batch.src, batch.src_lengths)
w = models["none"].decoder.attention(torch.zeros(3, 4, 16), enc_outputs, batch.src != PAD_token)
torch.testing.assert_close(w @ enc_outputs, enc_hidden[0].unsqueeze(1).expand(-1, 4, -1))

# %% [markdown]
# ## 8. Training: masked loss, teacher forcing, clipping
#
# One training step, `train_step`:
#
# * **Loss with a padding mask.** The decoder outputs **logits** (未归一化的对数几率) and the loss is `F.cross_entropy`,
#   which applies `log_softmax` and the negative log-likelihood in one call (the tutorial's `LogSoftmax` + `NLLLoss`
#   computes exactly the same, with the same numerical care; checked below): the model returns raw logits, which
#   greedy decoding's `argmax` uses directly, and one call takes `ignore_index`. `ignore_index=PAD_token` drops the padded target
#   positions, so the loss is the mean over *real* words.
# * **Clipping.** Recurrent networks occasionally produce huge gradients; **gradient clipping** (梯度裁剪) guards
#   against them: `clip_grad_norm_(…, 1.0)` rescales the whole gradient when its norm exceeds 1, and returns the norm
#   it measured (`train_step` returns it, so you can see how often clipping acts).
# * **Teacher forcing, always.** The decoder always reads the true previous word. When it translates, it reads only
#   its own guesses, a situation it never trained in; this mismatch is called **exposure bias (暴露偏差)** (Ranzato et
#   al. 2016). The classic version of PyTorch's tutorial teacher-forced each training pair with probability 0.5
#   (`teacher_forcing_ratio`) and fed the model's own predictions back otherwise; its 2023 rewrite teacher-forces
#   always. **Scheduled sampling (计划采样)** (Bengio et al. 2015) starts with teacher forcing and feeds more and more
#   of the model's own predictions as it improves. Section 14 trains this model on its own predictions, with the same
#   budget, and measures what teacher forcing costs and what it buys.
# * **Optimiser.** The classic tutorial uses two SGD optimisers (one for the encoder, one for the decoder) with
#   learning rate 0.01 on single pairs. We use batches of 80 and one Adam over all parameters, whose per-parameter
#   step sizes suit embeddings and recurrent networks, with a learning rate that decays linearly from 7e-3 to 1.4e-3
#   (`LambdaLR` sets it to the initial rate times the function of the number of `schedule.step()` calls). On the CPU, CUDA and MPS we use Adam's
#   fused form, `fused=True`: one call per step does all of Adam's arithmetic for each parameter tensor in one pass
#   (a C++ loop over the tensors on the CPU, a few kernel launches on CUDA), instead of the default implementation
#   (separate tensor operations per parameter on the CPU, multi-tensor `foreach` kernels on CUDA). This notebook does not compare the two optimisers on batches; section 15 measures what
#   batching buys in speed.


# %% tags=["shared"]
def train_step(model: Seq2Seq, batch, optimizer: torch.optim.Optimizer, clip: float = 1.0) -> tuple[float, float]:
    """One optimisation step on a padded batch; returns the mean loss per real target word and the gradient norm."""
    model.train()
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt)
    loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt.flatten(), ignore_index=PAD_token)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip)  # the norm before clipping
    optimizer.step()
    return loss.item(), norm.item()


assert train_step.__code__.co_argcount == 4

# %% [markdown]
# The loss ignores padding: the batch's loss equals the word-weighted mean of the sentences' losses computed one by
# one, and `cross_entropy` on logits equals `nll_loss` on `log_softmax`:

# %%
tiny = models["content"]  # hidden size 16, no dropout, in eval mode


def summed_loss(model, b):
    logits, _ = model(b.src, b.src_lengths, b.tgt)
    return F.cross_entropy(logits.flatten(0, 1), b.tgt.flatten(), ignore_index=PAD_token, reduction="sum")


total, words = summed_loss(tiny, batch), int((batch.tgt != PAD_token).sum())
one_by_one = [summed_loss(tiny, batch_tensors([p], input_lang, output_lang)) for p in demo_pairs]
torch.testing.assert_close(total, sum(one_by_one))
logits, _ = tiny(batch.src, batch.src_lengths, batch.tgt)
two_step_loss = F.nll_loss(F.log_softmax(logits, -1).flatten(0, 1), batch.tgt.flatten(), ignore_index=PAD_token)
torch.testing.assert_close(
    two_step_loss, F.cross_entropy(logits.flatten(0, 1), batch.tgt.flatten(), ignore_index=PAD_token)
)
print(
    f"{words} real target words in a {tuple(batch.tgt.shape)} target batch: padded loss = the sentences' losses alone;"
    " cross_entropy(logits) = nll_loss(log_softmax(logits))"
)

# %% [markdown]
# The training loop, `fit`: each **epoch (轮次)** shuffles the training pairs into length-bucketed batches (section 5).
# The three models are trained one after the other with the same seed, so they see the same batches in the same
# order and draw the same dropout masks. `step` is the function that makes one training step (`train_step` here;
# section 14 passes another). A progress bar shows each model's training while it runs (about ten seconds each on
# one CPU thread), with the time spent and an estimate of the time left, which the tutorial printed with its own
# `timeSince` helper. `seconds()` is the clock for the timings: on the CPU it counts this process's CPU time
# (`time.process_time`, which other programs on the machine do not inflate), on a GPU the wall time after waiting for
# the GPU to finish (CUDA runs asynchronously, and the CPU time would only count the kernel launches).


# %% tags=["shared"]
class Scores(NamedTuple):
    bleu: float  # corpus BLEU, 0-100 (sacrebleu)
    exact: float  # share of sentences translated exactly as the reference
    hypotheses: list[str]


@torch.no_grad()
def translate(
    model: Seq2Seq, sentences: list[str], src_lang: Lang, tgt_lang: Lang, unknown: str = "error", batch_size: int = 500
) -> list[tuple[list[str], torch.Tensor]]:
    """Greedy translations: for each sentence, the output words and the attention ``[len(words) + 1, source + 1]``.

    Sentences are normalised first. A word outside ``src_lang`` raises UnknownWordError naming it (``unknown="unk"``
    maps it to ``<unk>`` instead); an empty sentence, or one longer than MAX_LENGTH tokens (<eos> included), is
    refused. The model is given back in the mode it came in (training or eval).
    """
    if isinstance(sentences, str):  # a str is a sequence too: each of its letters would be translated
        raise TypeError(
            f"translate() takes a list of sentences, got one str: write translate(model, [{sentences!r}], ...)"
        )
    if not isinstance(sentences, (list, tuple)):  # None, bytes (a sequence of ints), a generator...
        raise TypeError(f"translate() takes a list of sentences (str), got {type(sentences).__name__}")
    was_training = model.training
    model.eval()  # dropout off: without it, translations are noisy and change from call to call
    try:
        device = next(model.parameters()).device
        results = []
        for i in range(0, len(sentences), batch_size):
            ids = [src_lang.encode(normalize_string(s), unknown) for s in sentences[i : i + batch_size]]
            too_long = [len(x) for x in ids if len(x) > MAX_LENGTH]
            if too_long:
                raise ValueError(
                    f"a sentence has {too_long[0]} tokens with <eos>; this model reads at most {MAX_LENGTH}"
                )
            src = nn.utils.rnn.pad_sequence([torch.tensor(x) for x in ids], batch_first=True, padding_value=PAD_token)
            words, weights = model.greedy(src.to(device), torch.tensor([len(x) for x in ids]))
            for row, x, w in zip(words.tolist(), ids, weights):
                out = tgt_lang.decode(row)
                results.append((out, w[: len(out) + 1, : len(x)].cpu()))
        return results
    finally:
        model.train(was_training)  # even after an error: a training loop that calls translate() keeps its dropout


def evaluate(model: Seq2Seq, pairs: list[tuple[str, str]], src_lang: Lang, tgt_lang: Lang) -> Scores:
    """Corpus BLEU and exact match of the greedy translations of ``pairs`` (source, reference)."""
    if not pairs:  # BLEU and the exact-match share of nothing are undefined
        raise ValueError("evaluate() needs at least one pair (source, reference) in pairs, got none")
    hypotheses = [" ".join(words) for words, _ in translate(model, [a for a, _ in pairs], src_lang, tgt_lang, "unk")]
    references = [b for _, b in pairs]
    # force=True only silences sacrebleu's warning that the text looks tokenised already (it is: normalize_string
    # split off the punctuation); its standard 13a tokeniser still runs and finds nothing more to split
    bleu = sacrebleu.corpus_bleu(hypotheses, [references], force=True).score
    return Scores(bleu, sum(h == r for h, r in zip(hypotheses, references)) / len(pairs), hypotheses)


assert Scores(1.0, 0.5, []).exact == 0.5

# %%
EPOCHS, BATCH_SIZE, HIDDEN, LR = 2, 80, 112, 7e-3


def seconds() -> float:
    """CPU time of this process on the CPU; wall time after a synchronisation on a GPU."""
    if device.type in ("cuda", "mps"):
        getattr(torch, device.type).synchronize()
        return time.perf_counter()
    return time.process_time()


def fit(model, epochs=EPOCHS, lr=LR, seed=0, step=train_step, desc="training"):
    torch.manual_seed(seed)  # the same dropout masks for every model
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=device.type in ("cpu", "cuda", "mps"))
    total_steps = epochs * math.ceil(len(train) / BATCH_SIZE)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - 0.8 * i / total_steps)
    rng = random.Random(seed)
    losses, norms = [], []
    start = seconds()
    with tqdm(total=total_steps, desc=desc, file=sys.stdout) as bar:  # stdout: no red stderr box
        for _ in range(epochs):
            for b in make_batches(train, input_lang, output_lang, BATCH_SIZE, rng):
                loss, norm = step(model, b.to(device), optimizer)
                losses.append(loss)
                norms.append(norm)
                schedule.step()
                bar.update()
                if len(losses) % 20 == 0:
                    bar.set_postfix(loss=f"{sum(losses[-20:]) / 20:.3f}")
    return {"losses": losses, "norms": norms, "seconds": seconds() - start}


NAMES = {"none": "no attention", "location": "location-based", "content": "content-based"}
models, runs = {}, {}
for name in NAMES:
    seed_everything(0)
    models[name] = build_model(name, input_lang, output_lang, HIDDEN)
    runs[name] = fit(models[name], desc=NAMES[name])
n_params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
for name in NAMES:
    clipped = sum(n > 1.0 for n in runs[name]["norms"]) / len(runs[name]["norms"])
    print(
        f"{NAMES[name]:15} {n_params[name]:,} parameters, {len(runs[name]['losses'])} training steps, gradient "
        + ("clipped in fewer than 1 in 20" if clipped < 0.05 else "clipped in 1 in 20 or more")
    )
assert all(r["losses"][-1] < r["losses"][0] / 4 for r in runs.values())
assert all(sum(n > 1.0 for n in r["norms"]) < 0.05 * len(r["norms"]) for r in runs.values())

# %% [markdown]
# The loss curves (smoothed over 25 steps), and the mean loss of each model's last 50 steps. These numbers move a
# little from machine to machine — floating-point rounding differs between processors, and 480 steps amplify it —
# so the cell checks their order with a margin rather than their digits:

# %%
# NBVAL_IGNORE_OUTPUT
smooth = {
    NAMES[name]: [sum(r["losses"][i : i + 25]) / 25 for i in range(0, len(r["losses"]) - 24, 25)]
    for name, r in runs.items()
}
plot_curves(
    smooth,
    xlabel="steps / 25",
    ylabel="training loss per word",
    logy=True,
    title="Same data, same budget, only the attention differs",
)
plt.show()
final = {name: sum(r["losses"][-50:]) / 50 for name, r in runs.items()}
print("mean loss of the last 50 steps:", ", ".join(f"{NAMES[n]} {final[n]:.3f}" for n in NAMES))
assert final["content"] < 0.8 * final["location"] and final["location"] < 0.8 * final["none"]

# %% [markdown]
# Gradient clipping acted in fewer than one step in twenty: on short sentences this GRU's gradients rarely explode, so
# here clipping is a guard rather than a regular part of the step. By the end of training the three are clearly apart.
# The no-attention model must squeeze the whole sentence into one vector of 112 numbers and unpack it word by word;
# the location-based model can read other source words, but only by guessing where they stand; the content-based model
# looks for them.
#

# ## 9. Greedy decoding and `translate()`
#
# At test time there is no target: the decoder starts from `<sos>`, feeds back its most likely word (greedy
# decoding, 贪心解码) and stops at `<eos>` or after `MAX_LENGTH` words. `translate` normalises sentences, refuses
# words outside the training vocabulary with a message that names them (a word it never saw has no embedding of its
# own; `<unk>` has a row, but no training sentence ever used it), and returns the words and the attention weights.
# `evaluate` maps such words to `<unk>` instead, so that every test sentence gets a score. `translate` also refuses
# an empty sentence, and a single string where it expects a list (a string is a sequence too: each of its letters
# would be translated); it switches the model to `eval()`, which turns dropout off, and, in a `finally`, back to the
# mode it came in, so that calling it in the middle of training does not leave dropout off. (The classic tutorial's
# `evaluate` never calls `eval()`: its translations keep dropout on, so they are noisier than they need be and change
# from one call to the next.)
#
# Decoding runs under `torch.no_grad()`, so autograd records nothing, and `argmax` gives the index of the most likely
# word directly. Older code writes `decoder_output.data.topk(1)` and stores `decoder_attention.data`: `.data` is the
# legacy way to step outside autograd, and it hides in-place changes from autograd's checks (notebook 02).
#
# Some translations by each model. The sentences come from the random **test** split (checked in the cell): a
# sentence from the training pairs would only show what a model memorised. They show an idiom in a question, an
# idiom with a city, the role swap of *manquer* (*elle me manque* is *I miss her*) and a possessor that moves.

# %%
# NBVAL_IGNORE_OUTPUT
examples = ["L'homme a-t-il faim ?", "Il fait nuit à Vienne.", "Elle me manque.", "Le cheval de ma sœur est fier."]
test_sources = {fr for fr, _ in test}
assert all(normalize_string(s) in test_sources and normalize_string(s) not in train_src for s in examples)
for name, model in models.items():
    for sentence, (words, _) in zip(examples, translate(model, examples, input_lang, output_lang)):
        print(f"{NAMES[name]:15} {sentence:30} -> {' '.join(words)}")
val_exact = evaluate(models["content"], val[:500], input_lang, output_lang).exact
print(f"content-based, exact match on 500 validation sentences: {val_exact:.0%}")
rare = sum(re.search(r"\bmanqu", fr) is not None for fr, _ in train)
print(f"training pairs with 'manquer': {rare} of {len(train)}")
assert val_exact >= 0.8 and rare < 0.01 * len(train)
assert all(model.training for model in models.values())  # as train_step left them: translate() gave them back

# %% [markdown]
# Which of these a model gets right can differ from one machine to another (the cell's output is not the same
# everywhere); what it checks holds on every run. Watch the role swap: *manquer* puts the one who misses in the object
# and the one missed in the subject, the other way round from English, and it is rare in training (the cell counted
# the pairs), so even the content-based model may swap the roles back. A word the model never saw has no embedding
# of its own, so `translate` refuses it and names it:

# %%
for sentence in ("Je mange un croissant.", "Le chat dort sur le canapé."):
    try:
        translate(models["content"], [sentence], input_lang, output_lang)
    except UnknownWordError as err:
        print(f"{sentence:28} -> {type(err).__name__}: {err}")

# %% [markdown]
# ## 10. Evaluation: BLEU and exact match
#
# The **exact match (精确匹配)** score counts the sentences translated word for word as the reference. **BLEU
# (双语评估替补)** (Papineni et al., 2002) is the standard corpus-level score: it pools the n-gram counts of all the
# sentences (so it is not the mean of per-sentence scores), and takes the geometric mean of the 1- to 4-gram
# precisions against the reference, times a **brevity penalty (简短惩罚)** $\min(1, e^{1 - r/c})$ for a corpus of
# translations (length $c$) shorter than the references (length $r$), on a 0–100 scale. The precisions are
# **clipped** (modified): an n-gram of the translation counts as correct at most as often as it occurs in the
# reference, so "the the the the" does not score a unigram precision of 100% against "the cat is here", only 1/4.
# We use `sacrebleu`, the reference implementation, rather than writing our own (small tokenisation details change
# BLEU by points).
#
# By that definition "the the the the" should score 0: it matches no bigram, trigram or 4-gram, and a geometric
# mean with a zero factor is zero. sacrebleu prints 16. The reason is **smoothing (平滑)**, on by default
# (`smooth_method="exp"`, the smoothing of the NIST `mteval` script): the k-th n-gram order with no match gets the
# precision $1 / (2^k \cdot \text{total})$ instead of 0 — here 1/(2·3) for the bigrams, 1/(4·2) for the trigrams,
# 1/(8·1) for the 4-gram. Smoothing exists for short texts, a single sentence above all, where one missing 4-gram
# would otherwise zero the score. On a whole test corpus every n-gram order has matches, so smoothing never acts
# there (checked below, on the real scores).

# %%
degenerate = sacrebleu.corpus_bleu(["the the the the"], [["the cat is here"]])
unsmoothed = sacrebleu.corpus_bleu(["the the the the"], [["the cat is here"]], smooth_method="none")
print(f"matched n-grams (1 to 4): {degenerate.counts} of {degenerate.totals}")
print("precisions used (%):     ", [round(p, 1) for p in degenerate.precisions])
print(f"BLEU {degenerate.score:.1f} with sacrebleu's default smoothing, {unsmoothed.score:.1f} without")
assert (degenerate.counts, degenerate.totals) == ([1, 0, 0, 0], [4, 3, 2, 1])
smoothed = [100 / 4] + [100 / (2**k * degenerate.totals[k]) for k in (1, 2, 3)]
assert all(math.isclose(p, q) for p, q in zip(degenerate.precisions, smoothed))
assert math.isclose(degenerate.score, math.prod(p / 100 for p in smoothed) ** 0.25 * 100)  # brevity penalty 1
assert round(degenerate.score, 1) == 16.0 and unsmoothed.score == 0.0

# %% [markdown]
# These BLEU scores are **not comparable with published ones**: the corpus is synthetic and small, its sentences are
# short and repetitive, the text is normalised (lower case, no accents) before scoring, and each sentence has one
# reference. They compare models *within* this notebook.
#
# The exact numbers depend a little on the CPU (floating-point rounding differs between processors, and two epochs
# of training amplify it), so the cell checks the comparisons with margins:

# %%
# NBVAL_IGNORE_OUTPUT
results = {
    (name, split): evaluate(model, data, input_lang, output_lang)
    for name, model in models.items()
    for split, data in (("random", test), ("compositional", comp))
}
print(f"{'model':16} {'split':14} {'BLEU':>6} {'exact':>7}")
for (name, split), s in results.items():
    print(f"{NAMES[name]:16} {split:14} {s.bleu:6.1f} {s.exact:7.1%}")
bleu = {key: s.bleu for key, s in results.items()}
exact = {key: s.exact for key, s in results.items()}
assert bleu["content", "random"] >= 90 and exact["content", "random"] >= 0.8
assert bleu["content", "random"] > bleu["location", "random"] + 3
assert bleu["content", "compositional"] > bleu["location", "compositional"] + 10
assert all(bleu["location", split] > bleu["none", split] + 15 for split in ("random", "compositional"))
assert all(bleu[name, "compositional"] < bleu[name, "random"] for name in NAMES)
for (_, split), s in results.items():  # smoothing changes none of these scores
    data = test if split == "random" else comp
    plain = sacrebleu.corpus_bleu(s.hypotheses, [[b for _, b in data]], force=True, smooth_method="none")
    assert math.isclose(plain.score, s.bleu) and min(plain.counts) > 0

# %% [markdown]
# Content-based attention translates the random split almost perfectly (BLEU at least 90, at least 80% of the
# sentences exact); location-based attention is clearly behind, and the model without attention far behind. Every
# model scores lower on the compositional split, and there the gaps widen. Some translations of the random test
# split (`✓` = exact match):

# %%
# NBVAL_IGNORE_OUTPUT
rows = random.Random(5).sample(range(len(test)), 10)
for i in rows:
    print(f"{test[i][0]}  (reference: {test[i][1]})")
    for name in NAMES:
        hyp = results[name, "random"].hypotheses[i]
        print(f"    {'✓' if hyp == test[i][1] else '✗'} {NAMES[name]:15} {hyp}")
assert sum(h == r for h, (_, r) in zip(results["content", "random"].hypotheses, test)) >= 0.8 * len(test)

# %% [markdown]
# ## 11. BLEU against sentence length
#
# Bahdanau et al. (2015) showed attention's effect with one figure: BLEU against the length of the source sentence
# (left; exact match on the right). Without attention, the decoder must carry everything in one fixed-size vector, and long sentences suffer. Our
# sentences are short (3 to 12 tokens, punctuation included), so expect a milder version of their picture:

# %%
# NBVAL_IGNORE_OUTPUT
buckets = [(3, 5), (6, 6), (7, 7), (8, 8), (9, 9), (10, 12)]
by_length, exact_by_length = {}, {}
for name in NAMES:
    hypotheses = results[name, "random"].hypotheses
    for lo, hi in buckets:
        idx = [i for i, (fr, _) in enumerate(test) if lo <= len(fr.split()) <= hi]
        by_length[name, lo] = sacrebleu.corpus_bleu(
            [hypotheses[i] for i in idx], [[test[i][1] for i in idx]], force=True
        ).score
        exact_by_length[name, lo] = 100 * sum(hypotheses[i] == test[i][1] for i in idx) / len(idx)
sizes = [sum(lo <= len(fr.split()) <= hi for fr, _ in test) for lo, hi in buckets]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), layout="constrained")
for ax, scores, label in ((axes[0], by_length, "BLEU"), (axes[1], exact_by_length, "exact match (%)")):
    for name in NAMES:
        ax.plot(range(len(buckets)), [scores[name, lo] for lo, _ in buckets], marker="o", label=NAMES[name])
    ax.set_xticks(
        range(len(buckets)),
        labels=[f"{lo}–{hi}\n({n})" if hi > lo else f"{lo}\n({n})" for (lo, hi), n in zip(buckets, sizes)],
    )
    ax.set_xlabel("French tokens in the source (test sentences, how many in brackets)")
    ax.set_ylabel(label)
axes[0].legend()
plt.show()
print("test sentences per bucket:", sizes)
short_gap = by_length["content", 3] - by_length["none", 3]
long_gap = by_length["content", 10] - by_length["none", 10]
content_range = max(by_length["content", lo] for lo, _ in buckets) - min(by_length["content", lo] for lo, _ in buckets)
drop = {name: exact_by_length[name, 3] - exact_by_length[name, 10] for name in NAMES}
print(
    f"BLEU gap between content-based and no attention: {short_gap:.0f} on the shortest, {long_gap:.0f} on the longest"
)
print(f"content-based BLEU varies by {content_range:.0f} across the buckets")
print(
    "exact match lost from the shortest to the longest bucket (points):", {NAMES[n]: round(d) for n, d in drop.items()}
)
assert long_gap > short_gap + 10 and all(by_length["content", lo] > by_length["none", lo] for lo, _ in buckets)
assert content_range < 10 and by_length["location", 10] < by_length["location", 6] - 5
assert all(exact_by_length["content", lo] > exact_by_length["none", lo] + 30 for lo, _ in buckets)
assert all(d > 0 for d in drop.values()) and drop["content"] < min(drop["none"], drop["location"]) - 5

# %% [markdown]
# The gap between content-based attention and no attention widens with the length of the sentence: the longer the
# sentence, the more a single summary vector has to hold. Exact match (right) is stricter — one wrong token anywhere
# spoils the sentence — so it falls with length for every model, least for content-based attention. Content-based
# attention stays nearly flat. Location-based attention sits in between and also drops on the longest sentences,
# plausibly because their last words stand at positions that few training sentences reach, so it has learnt little
# about where to look there.
#
# ## 12. Attention heat maps
#
# A heat map of the attention weights shows, for each word the decoder wrote (a row), where it looked in the source
# (a column). The classic tutorial's `showAttention` labels the axes with `ax.set_xticklabels([''] + words)` and only
# then asks for a tick at every integer with `MultipleLocator(1)`: the labels are given before the ticks are known,
# and the empty first label compensates for an extra tick at −1. Matplotlib warns about that order, because labels
# set that way are matched to whatever ticks the locator later picks. `warnings.catch_warnings(record=True)`
# collects warnings into a list instead of printing them, so the cell can show the text:

# %%
import warnings  # noqa: E402

import matplotlib.ticker as ticker  # noqa: E402

fig, (old_way, new_way) = plt.subplots(1, 2)
source_words, written = ["je", "<eos>"], ["i", "<eos>"]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    old_way.matshow(torch.eye(2).numpy(), cmap="bone")
    old_way.set_xticklabels([""] + source_words)  # labels first ...
    old_way.xaxis.set_major_locator(ticker.MultipleLocator(1))  # ... ticks afterwards
for w in caught:
    print(f"{type(w.message).__name__}: {w.message}")
with warnings.catch_warnings(record=True) as caught_new:
    warnings.simplefilter("always")
    new_way.matshow(torch.eye(2).numpy(), cmap="bone")
    new_way.set_xticks(range(len(source_words)), labels=source_words)  # ticks and labels together
fig.canvas.draw()
print(
    "old way, ticks and labels:",
    list(zip(old_way.get_xticks().tolist(), [t.get_text() for t in old_way.get_xticklabels()])),
)
print(
    "new way, ticks and labels:",
    list(zip(new_way.get_xticks().tolist(), [t.get_text() for t in new_way.get_xticklabels()])),
)
plt.close(fig)
assert caught and all("FixedLocator" in str(w.message) for w in caught) and not caught_new
assert [t.get_text() for t in new_way.get_xticklabels()] == source_words

# %% [markdown]
# Here the padding label `''` happens to land on the extra tick at −1, so the labels come out right — by luck, not
# by construction. Setting ticks and labels in one call, `ax.set_xticks(range(n), labels=words)`, puts label *i* on
# tick *i*, with no warning. Below, rows are the English words produced, columns the French source words (plus
# `<eos>`); bright cells show where the decoder looked while writing each word. The three sentences come from the
# test split (checked in the cell).


# %%
def show_attention(ax, source: str, output_words: list[str], attentions: torch.Tensor, title: str):
    """The tutorial's showAttention, with ticks and labels set together (and one Axes per call)."""
    xs, ys = normalize_string(source).split(" ") + ["<eos>"], output_words + ["<eos>"]
    image = ax.imshow(attentions[: len(ys), : len(xs)].numpy(), cmap="bone", vmin=0, vmax=1)
    ax.set_xticks(range(len(xs)), labels=xs, rotation=90)
    ax.set_yticks(range(len(ys)), labels=ys)
    ax.set_title(title, fontsize=9)
    return image


sentences = ["Le cheval de ma sœur est fier.", "Ils portent la tomate sale.", "A-t-elle peint le lit ?"]
assert all(normalize_string(s) in test_sources for s in sentences)
fig, axes = plt.subplots(3, 3, figsize=(13, 13), layout="constrained")
for row, name in enumerate(NAMES):
    for col, (sentence, (words, attn)) in enumerate(
        zip(sentences, translate(models[name], sentences, input_lang, output_lang))
    ):
        image = show_attention(axes[row, col], sentence, words, attn, f"{NAMES[name]}:\n{' '.join(words)}")
fig.colorbar(image, ax=axes, shrink=0.6)
plt.show()
assert all(len(w) >= 1 for w, _ in translate(models["content"], sentences, input_lang, output_lang))

# %% [markdown]
# What to look for. The no-attention maps are one bright column on `<eos>`: by construction, the context is the
# encoder's final state. The content-based maps show the **alignment (对齐)** of words whose order changed: *my sister*
# read from *ma soeur*, *dirty* from *sale* (ahead of *tomate*, which comes next for *tomato*), *paint* from
# *peint*. The English question needs an auxiliary, *did*, that French does not have: it has no source word of its
# own, and where its row looks varies from run to run. The possessive *s* is read at *de*, the French word that
# does its job. Some cells may sit a word late: with a one-directional encoder the output at a position has read
# the sentence only up to there.
# Bahdanau et al. used a **bidirectional encoder (双向编码器)**, whose outputs see both sides of each word, for sharper
# alignments (对齐). The location-based maps are more diffuse: the model learnt where words *usually* stand. These maps
# come from one training run and can differ in their details on another machine; the measurement below checks the
# pattern over hundreds of words.
#
# Does the largest weight fall on the right word? For nouns and adjectives the corpus generator's lexicon
# (`tc.NOUNS`, `tc.ADJECTIVES`) gives a known one-to-one word alignment: *chat* ↔ *cat*, *noir* ↔ *black*. For every
# such word a model writes in its base form (singular; masculine singular for French adjectives), appearing once in
# its output with its French word once in the source, we check whether the row of attention weights that produced it
# peaks on the aligned French word, over the first 600 test sentences.

# %%
# NBVAL_IGNORE_OUTPUT
lexicon: dict[str, set[str]] = {}  # French word (normalised) -> its English translations
for noun in tc.NOUNS:
    lexicon.setdefault(normalize_string(noun.fr), set()).add(noun.en)
for adj in tc.ADJECTIVES:
    lexicon.setdefault(normalize_string(adj.fr), set()).update({adj.en, adj.en_person} - {""})
for name in tc.NAMES:  # "Marie" normalises to "marie", which is also the adjective "marié" (married)
    lexicon.pop(normalize_string(name), None)


def known_alignments(source: str, output_words: list[str]) -> list[tuple[int, int]]:
    """(output position, source position) of words whose translation is known and unambiguous."""
    src = source.split(" ")
    found = []
    for i, word in enumerate(output_words):
        sources = [j for j, fr in enumerate(src) if word in lexicon.get(fr, ())]
        if output_words.count(word) == 1 and len(sources) == 1:
            found.append((i, sources[0]))
    return found


def peaks_on_aligned_word(model, data) -> tuple[int, int]:
    """How many aligned words' attention rows peak on their source word, out of how many aligned words."""
    hits = total = 0
    for (fr, _), (words, attn) in zip(data, translate(model, [fr for fr, _ in data], input_lang, output_lang, "unk")):
        for i, j in known_alignments(fr, words):
            hits += int(attn[i].argmax()) == j
            total += 1
    return hits, total


peaks = {name: peaks_on_aligned_word(models[name], test[:600]) for name in ("location", "content")}
for name, (hits, total) in peaks.items():
    print(f"{NAMES[name]:15} attention peaks on the aligned source word for {hits / total:.0%} of {total} words")
assert peaks["content"][0] >= 0.85 * peaks["content"][1] and peaks["location"][0] <= 0.70 * peaks["location"][1]
assert min(total for _, total in peaks.values()) > 300

# %% [markdown]
# Content-based attention puts its largest weight on the aligned French word nearly every time (the cell checks at
# least 85%); location-based attention does so for a minority of the words (at most 70% is checked): it guesses where
# a word usually stands, and its maps are blurred accordingly.
#
# ## 13. Where the compositional split fails
#
# The compositional split asks for combinations never seen in training. Broken down by the kind of held-out
# combination (a sentence can contain more than one), with some of the content-based model's mistakes:

# %%
# NBVAL_IGNORE_OUTPUT
categories = sorted({c for *_, cats in comp_rows for c in cats})
print(f"{'held-out combination':20}{'pairs':>6}" + "".join(f"{NAMES[n]:>16}" for n in NAMES) + "   (exact match)")
per_category = {}
for cat in categories:
    idx = [i for i, (*_, cats) in enumerate(comp_rows) if cat in cats]
    per_category[cat] = {
        n: sum(results[n, "compositional"].hypotheses[i] == comp[i][1] for i in idx) / len(idx) for n in NAMES
    }
    print(f"{cat:20}{len(idx):6d}" + "".join(f"{per_category[cat][n]:16.1%}" for n in NAMES))
ours = results["content", "compositional"].hypotheses
for i in [i for i in range(len(comp)) if ours[i] != comp[i][1]][:8]:
    print(f"  {'; '.join(comp_rows[i][2]):15} {comp[i][0]:44} -> {ours[i]}   (reference: {comp[i][1]})")
assert all(sum(cat in cats for *_, cats in comp_rows) >= 30 for cat in categories)
assert all(per_category[c]["content"] > per_category[c]["location"] + 0.15 for c in ("adjective+noun", "verb+pronoun"))
assert all(acc["content"] > acc["none"] + 0.3 for acc in per_category.values())
assert min(per_category, key=lambda c: per_category[c]["content"]) == "verb+pronoun"

# %% [markdown]
# The hardest combination is a verb never seen with an object pronoun: in training, *cherche*, *oublie* or *écoute*
# are always followed by their object, so when the object is a pronoun *before* the verb (*le policier nous cherche*)
# the model has never read that verb with nothing after it. Look at the mistakes printed above: it drops the pronoun,
# or puts in a word it has seen after that verb, or swaps the verb for one it has seen with the pronoun.
# Adjective–noun combinations fare much better, because the model has seen every adjective after many other nouns.
# What a model learns is partly *which words go together* — exactly what this split withholds. Content-based attention
# is far ahead of no attention in every category, and of location-based attention in the two large ones; but it does
# not by itself give systematic generalisation, and neither do bigger architectures: on benchmarks built for it (SCAN,
# Lake & Baroni 2018; COGS, Kim & Linzen 2020) Transformers fail at such combinations too.

# %% [markdown]
# ## 14. Teacher forcing against training on its own predictions
#
# Teacher forcing trains the decoder in a situation it never meets when it translates: in training it always reads
# the true previous word, in use it reads its own (exposure bias, section 8). Does that hurt? The direct test is to
# train the same model the other way, on its own predictions, and compare the two as they are used: free-running,
# with greedy decoding.
#
# `train_step_free_running` runs the decoder one step at a time, as greedy decoding does, but with gradients: the
# input at each step is the word the model itself predicted at the step before (the argmax of its logits), while the
# loss still compares each step's logits with the reference word at that position, over the reference's length
# (padding ignored, as before). `ratio` mixes the two regimes: each sentence of the batch is teacher-forced with
# probability `ratio`, as the classic tutorial did for each pair with `teacher_forcing_ratio = 0.5`; `ratio=0` is
# pure free running, and `ratio=1` is teacher forcing again, one step at a time.
#
# **What `.detach()` does here.** Older code writes the fed-back word as `topi.squeeze().detach()` ("detach from
# history as input"). The index of the largest logit is an integer tensor that `argmax` (like `topk`'s indices) returns
# outside the autograd graph, so that `.detach()` changes nothing. Gradients still flow from step to step through
# the decoder's hidden state, but never through the *choice* of a word: picking the largest entry is not
# differentiable. (Training through that choice takes other tools, such as reinforcement learning or a
# differentiable relaxation like the Gumbel-softmax.)


# %% tags=["shared"]
def train_step_free_running(
    model: Seq2Seq, batch, optimizer: torch.optim.Optimizer, ratio: float = 0.0, clip: float = 1.0
) -> tuple[float, float]:
    """Like train_step, but the decoder reads its own previous prediction (each sentence: the truth with prob. ratio)."""
    model.train()
    encoder_outputs, hidden = model.encoder(batch.src, batch.src_lengths)
    mask = batch.src != PAD_token
    use_truth = torch.rand(batch.tgt.shape[0], 1, device=batch.tgt.device) < ratio  # [B, 1], one draw per sentence
    previous = torch.full_like(batch.tgt[:, :1], SOS_token)
    steps = []
    for t in range(batch.tgt.shape[1]):
        logits, hidden, _ = model.decoder(previous, hidden, encoder_outputs, mask)  # one step: T = 1
        steps.append(logits)
        guess = logits.argmax(-1)  # [B, 1] word indices: no gradient flows through this choice
        previous = torch.where(use_truth, batch.tgt[:, t : t + 1], guess)
    logits = torch.cat(steps, 1)  # [B, T, V], as the one-call pass gives
    loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt.flatten(), ignore_index=PAD_token)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item(), norm.item()


assert train_step_free_running.__code__.co_argcount == 5

# %% [markdown]
# Two checks on a small untrained model (hidden size 16, no dropout), with a learning rate of 0 so that a step
# changes nothing: with `ratio=1` the step-by-step loss equals `train_step`'s one-call loss (up to rounding), and
# the argmax carries no gradient:

# %%
seed_everything(0)
small = build_model("content", input_lang, output_lang, hidden_size=16, dropout_p=0.0)
frozen = torch.optim.SGD(small.parameters(), lr=0.0)  # a step that changes nothing
one_call, _ = train_step(small, batch, frozen)
step_by_step, _ = train_step_free_running(small, batch, frozen, ratio=1.0)
own_guesses, _ = train_step_free_running(small, batch, frozen, ratio=0.0)
print(f"loss with teacher forcing: one call {one_call:.3f}, step by step {step_by_step:.3f}")
print(f"loss on its own predictions (untrained, so no better): {own_guesses:.3f}")
logits, _ = small(batch.src, batch.src_lengths, batch.tgt)
guess = logits.argmax(-1)
print(f"logits: requires_grad={logits.requires_grad} | argmax: {guess.dtype}, requires_grad={guess.requires_grad}")
assert math.isclose(one_call, step_by_step, rel_tol=1e-5)
assert logits.requires_grad and not guess.requires_grad and guess.grad_fn is None

# %% [markdown]
# Now the experiment: the content-based model of section 8, built from the same seed (so with the same initial
# weights), trained with the same batches, schedule and number of steps, but on its own predictions (`ratio=0`).
# Training one step at a time is slower too; the bar shows it:

# %%
seed_everything(0)
free_model = build_model("content", input_lang, output_lang, HIDDEN)
free_run = fit(free_model, step=train_step_free_running, desc="own predictions")
print(f"trained on its own predictions: {len(free_run['losses'])} steps, as many as the teacher-forced model")
assert len(free_run["losses"]) == len(runs["content"]["losses"])

# %% [markdown]
# Both models are scored as they are used, free-running: BLEU and exact match on both test splits. The table also
# gives the per-word accuracy on the random test split in both modes — given the true previous words
# (teacher-forced) and given their own (free-running; the free-running words are compared position by position
# with the reference, so one early error can shift everything after it):


# %%
@torch.no_grad()
def word_accuracy(model, data, teacher_forcing: bool) -> float:
    """Share of the reference's words predicted at their position, given the true or the model's own prefix."""
    model.eval()
    correct = total = 0
    for b in make_batches(data, input_lang, output_lang, 500):
        b = b.to(device)
        if teacher_forcing:
            predicted = model(b.src, b.src_lengths, b.tgt)[0].argmax(-1)
        else:
            out = model.greedy(b.src, b.src_lengths, max_length=b.tgt.shape[1])[0]
            predicted = F.pad(out, (0, b.tgt.shape[1] - out.shape[1]), value=PAD_token)
        real = b.tgt != PAD_token
        correct += int(((predicted == b.tgt) & real).sum())
        total += int(real.sum())
    return correct / total


assert word_accuracy.__doc__.startswith("Share")

# %%
# NBVAL_IGNORE_OUTPUT
regimes = {
    "teacher forcing": (
        models["content"],
        runs["content"],
        results["content", "random"],
        results["content", "compositional"],
    ),
    "own predictions": (
        free_model,
        free_run,
        evaluate(free_model, test, input_lang, output_lang),
        evaluate(free_model, comp, input_lang, output_lang),
    ),
}
table = {}
print(f"{'':16}{'training':>9}   {'random split':^14}   {'compositional':^14}   word accuracy, random split")
print(
    f"{'trained with':16}{'time':>9}   {'BLEU':>6}{'exact':>8}   {'BLEU':>6}{'exact':>8}   teacher-forced  free-running"
)
for label, (model, run, random_split, comp_split) in regimes.items():
    forced, free = word_accuracy(model, test, True), word_accuracy(model, test, False)
    table[label] = {"bleu": random_split.bleu, "comp": comp_split.bleu, "forced": forced, "free": free}
    print(
        f"{label:16}{run['seconds']:7.0f} s   {random_split.bleu:6.1f}{random_split.exact:8.1%}   "
        f"{comp_split.bleu:6.1f}{comp_split.exact:8.1%}   {forced:14.1%}  {free:12.1%}"
    )
forcing, own = table["teacher forcing"], table["own predictions"]
assert forcing["bleu"] > own["bleu"] + 8 and forcing["comp"] > own["comp"] + 10
assert forcing["free"] > own["free"] + 0.03
assert all(row["forced"] > row["free"] for row in table.values())
assert free_run["seconds"] > runs["content"]["seconds"]

# %% [markdown]
# With the same budget, the model trained on its own predictions translates clearly worse, on both splits, and its
# training took longer. Why it learns more slowly: early in training its predictions are mostly wrong, so the
# decoder is asked for reference word *t* after a prefix that is not the reference's — after writing *the the*,
# produce *cat* — a target that no longer fits what it wrote. Teacher forcing gives every step a consistent prefix
# from the first update on, and lets the decoder's GRU run over the whole target in one call.
#
# The teacher-forced model never read its own mistakes in training, and yet it is also the better one free-running:
# on this data and budget, what exposure bias costs is far less than what teacher forcing buys. Both models are more
# accurate when they are given the true previous words than free-running. That gap is the information in the true
# prefix, present for both, so it is not a measure of exposure bias — the comparison between the two rows is.
#
# Teacher forcing is the default in practice: the 2023 rewrite of PyTorch's tutorial always uses it, and Transformers
# are trained the same way (the target shifted right, all positions at once). Mixed schedules help on long outputs
# where errors compound; scheduled sampling starts with teacher forcing and feeds back more and more of the model's
# own predictions as it gets better. To try the classic tutorial's setting, train a fresh model with
# `fit(model, step=lambda m, b, o: train_step_free_running(m, b, o, ratio=0.5))` and see where it lands.
#
# ## 15. Speed: one pair at a time against batches
#
# The classic tutorial's `train()` runs the encoder word by word and the decoder word by word for a *single* pair,
# then takes an optimiser step. `train_one_pair` is that loop, on the same model:


# %% tags=["shared"]
def train_one_pair(model: Seq2Seq, src: torch.Tensor, tgt: torch.Tensor, optimizer: torch.optim.Optimizer) -> float:
    """The classic tutorial's train(): one pair (1-D index tensors ending with <eos>), encoder and decoder word by word."""
    model.train()
    encoder, decoder = model.encoder, model.decoder
    hidden = torch.zeros(1, 1, encoder.hidden_size, device=src.device)
    outputs = []
    for word in src:  # one encoder call per source word
        output, hidden = encoder.gru(encoder.embedding(word.view(1, 1)), hidden)
        outputs.append(output)
    encoder_outputs = torch.cat(outputs, 1)  # [1, S, H]
    mask = torch.ones(1, len(src), dtype=torch.bool, device=src.device)
    previous, loss = torch.tensor([[SOS_token]], device=src.device), 0.0
    for word in tgt:  # teacher forcing, one word at a time
        logits, hidden, _ = decoder(previous, hidden, encoder_outputs, mask)
        loss = loss + F.cross_entropy(logits[0], word.view(1))
        previous = word.view(1, 1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item() / len(tgt)


assert train_one_pair.__code__.co_argcount == 4

# %%
# NBVAL_IGNORE_OUTPUT
seed_everything(0)
probe = build_model("content", input_lang, output_lang, HIDDEN).to(device)
sgd = torch.optim.SGD(probe.parameters(), lr=0.01)
start = seconds()
for fr, en in train[:64]:
    src = torch.tensor(input_lang.encode(fr), device=device)
    tgt = torch.tensor(output_lang.encode(en), device=device)
    train_one_pair(probe, src, tgt, sgd)
one_by_one_rate = 64 / (seconds() - start)
adam = torch.optim.Adam(probe.parameters(), lr=LR, fused=device.type in ("cpu", "cuda", "mps"))
start = seconds()
for b in make_batches(train[: BATCH_SIZE * 8], input_lang, output_lang, BATCH_SIZE, random.Random(0)):
    train_step(probe, b.to(device), adam)
batched_rate = BATCH_SIZE * 8 / (seconds() - start)
print(f"one pair at a time: {one_by_one_rate:6.0f} pairs per second")
print(f"batches of {BATCH_SIZE}:      {batched_rate:6.0f} pairs per second ({batched_rate / one_by_one_rate:.0f}x)")
print(
    "training time:",
    ", ".join(f"{NAMES[n]} {r['seconds']:.0f} s" for n, r in runs.items()),
    f"| on its own predictions {free_run['seconds']:.0f} s",
)
assert batched_rate > 10 * one_by_one_rate

# %% [markdown]
# Batches make training more than ten times faster, on the same model and the same CPU: most of the time of a
# one-pair step goes to calling small operations, not to computing. `benchmarks/seq2seq_speed.py`, in the course's
# repository, measures this more carefully (both loops side by side, capped in time, including the time each needs
# to reach the same training loss); `benchmarks/README.md` gives its figures.

# %% [markdown]
# ## Exercises (练习)
#
# Four exercises, easiest first: predict, two functions to write, then a stretch that combines this notebook with
# notebook 01. Each has a **stub cell** that starts with `# ✏️ Exercise N`: edit it and run it. The **check cell**
# below it then says *correct*, or *not yet* with a hint and the section to re-read, or *not attempted yet* while
# the stub is untouched. Where a task says how to compute something (no Python loop, not with sacrebleu), the check
# reads your function for it too. This section does not depend on the lesson's cells (no training; the checks make
# their own tensors, and exercise 3's check reads the corpus and runs the lesson's model itself): after a kernel
# restart, run its first cell and go on. `make progress` (without make, e.g. on Windows:
# `python tools/course.py progress`) lists which exercises of every notebook pass.

# %%
import torch
import torch.nn.functional as F

from utils.exercises import Checker
from utils.seq2seq import PAD_token

ex = Checker("05")

# %% [markdown]
# ### Exercise 1 · The `???` line
#
# In the classic `AttnDecoderRNN`, one line computes the attention weights:
# `attn_weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)  # ???`. Replace the question
# marks with shapes: which shapes go in and come out, and why? Take section 6's
# batched version of that decoder, `ClassicAttnDecoderRNN(hidden_size=32, output_size=V)` with the default
# `max_length=MAX_LENGTH` (13), decoding one step for a batch of 4 sentences whose encoder outputs have shape
# `[4, 7, 32]` (the longest sentence has 7 tokens). Predict the shape of the input of `self.attn`
# (`torch.cat((embedded, hidden[0]), 1)`), the shape of `attn_weights`, and the number of parameters of `self.attn`.
# Write them as a list `[tuple, tuple, int]`, then check.

# %%
# ✏️ Exercise 1: replace ... with [shape of the input of self.attn, shape of attn_weights, parameters of self.attn]
answer_1 = ...

# %%
ex.check(1, answer_1)

# %% [markdown]
# ### Exercise 2 · Luong's dot attention, masked
#
# Section 7's content-based attention compares the decoder state with what is *at* each source position through a
# small network, $v^\top \tanh(W s_t + U h_j)$. Luong et al. (2015) also proposed the simplest content-based score,
# the **dot product** $s_t \cdot h_j$, which has no parameters at all. Write `dot_attention(states, keys, mask)`:
# `states` `[B, T, H]` are the decoder states, `keys` `[B, S, H]` the encoder outputs, and `mask` `[B, S]` is True
# at real words and False at padding. Return `(weights, context)`: `weights` `[B, T, S]` is the softmax over the
# source positions of the scores $s_t \cdot h_j$, with weight 0 on padded positions (each row still sums to 1), and
# `context` `[B, T, H]` is $\sum_j \alpha_{tj} h_j$. Write it without a Python loop, as section 7 computes
# attention for all steps and sentences at once: two batched matrix products and a masked softmax. It must work for
# `T = 1` too, one step of greedy decoding.


# %%
# ✏️ Exercise 2: write the body of the function
def dot_attention(states: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(2, dot_attention)

# %% [markdown]
# ### Exercise 3 · The loss over real words, per sentence and per batch
#
# Section 8's `train_step` leaves the padding out of the loss with `ignore_index=PAD_token` and gets one number, the
# mean over the batch's real target words. To see which sentences a model finds hard you also want each sentence's
# own loss. Write `masked_losses(logits, tgt)`: `logits` `[B, T, V]` is the first of the two tensors `Seq2Seq.forward` returns and `tgt`
# `[B, T]` the padded target batch. Return `(per_sentence, mean)`: `per_sentence` `[B]` is each sentence's mean
# cross-entropy over its real words only, and `mean` the mean over all the real words of the batch, the loss
# `train_step` minimises, as a 0-d tensor that `backward()` can be called on. No Python loop, and one call of
# `F.cross_entropy`: with `reduction="none"` it gives the loss of every position, and a mask does the rest, `mean`
# included.
#
# The check runs the lesson's model (built by section 7's `build_model`) on real batches of the corpus, then
# compares `per_sentence` with each sentence's loss computed alone, without padding, as section 8 does, and `mean`
# and its gradient with what `train_step` computes.


# %%
# ✏️ Exercise 3: write the body of the function
def masked_losses(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(3, masked_losses)

# %% [markdown]
# ### Exercise 4 · Clipped n-gram counts for a batch (stretch)
#
# Section 10's BLEU rests on **clipped** n-gram counts: an n-gram of the hypothesis (the model's translation) counts
# as matched at most as often as it occurs in the reference. Write `clipped_counts(hyp, ref, n)` for a batch of
# token ids: `hyp` `[B, T]` and `ref` `[B, R]`, int64, padded at the end with `PAD_token` (0) as in section 5.
# Return `(matches, totals)`, two tensors of shape `[B]`: `totals[b]` is the number of n-grams in hypothesis `b`
# (padding is not a word; a hypothesis with fewer than `n` words has none), and `matches[b]` is the sum, over the distinct n-grams $g$ of hypothesis `b`, of
# min(count of $g$ in the hypothesis, count of $g$ in reference `b`). "the the the the" against "the cat is here"
# gives 1 match out of 4 unigrams and 0 out of 3 bigrams. Summed over a corpus, these are the `counts` and `totals`
# that sacrebleu printed in section 10. The check tries `n = 1` and `n = 2`.
#
# Count them yourself: sacrebleu (section 10) computes these counts, and an answer that calls it is refused. Any
# other correct way passes. To practise notebook 01, try it without a Python loop: `F.one_hot(ids, V).sum(1)` counts
# the words of each sentence (a reduction over the positions, 01's section 3), `torch.minimum` clips, and for
# `n = 2` each pair of neighbouring ids can first be turned into one number.


# %%
# ✏️ Exercise 4: write the body of the function
def clipped_counts(hyp: torch.Tensor, ref: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("your code here")


# %%
ex.check(4, clipped_counts)

# %% [markdown]
# ## Summary
#
# * The corpus is generated offline by a bilingual grammar (pyrealb) in Tatoeba's format; it contains word-order
#   changes, idioms, agreement and questions, and comes with a random and a compositional test split. The loader
#   reads the real Tatoeba `eng-fra.txt` just as well.
# * Sentences are normalised as in the classic tutorial (with ligatures fixed), split by sentence so that no test
#   sentence was seen in training, indexed by `Lang` with `<pad>`, `<sos>`, `<eos>` and `<unk>`, and padded into
#   length-bucketed batches; packing keeps padding out of the encoder and `ignore_index` keeps it out of the loss.
# * The classic tutorial's attention is location-based: it scores *fixed positions* from the previous word and the
#   decoder state (which carries a summary of the source), never the words at those positions.
# * With everything else equal, the choice of context decides the result: without attention the model must carry
#   the sentence in one vector and loses most on long sentences; location-based attention helps; content-based
#   additive attention translates the random split almost perfectly (BLEU ≥ 90, ≥ 80% exact) and is far better on
#   combinations never seen in training, where every model still fails often.
# * Teacher forcing feeds the true previous words, which makes training fast (one GRU call for the whole target)
#   but leaves the model untrained on its own mistakes (exposure bias, 暴露偏差). Trained on its own predictions
#   with the same budget, the same model translates far worse: here teacher forcing buys much more than exposure
#   bias costs. Teacher-forced accuracy is higher than free-running accuracy for both, because the true prefix is
#   given. Gradient clipping guards the recurrent network against exploding gradients.
# * BLEU pools clipped n-gram counts over the corpus; sacrebleu smooths n-gram orders without a match (which is why
#   "the the the the" scores 16, not 0), and on a whole test corpus the smoothing does not act.
# * Batching, and a decoder whose GRU can run over the whole target at once, is what makes this trainable in a
#   minute: one pair at a time trains more than ten times fewer pairs per second. These models are small enough
#   that one CPU thread is a safe choice.
#
# **Going further.** Beam search keeps several candidate translations instead of the single greedy one; a
# bidirectional encoder gives each source position both sides of its context (sharper alignments); subword units
# (BPE) replace `<unk>` for words never seen whole; and the dot-product score of exercise 2, scaled and with several
# heads, is the attention of Transformers (`F.scaled_dot_product_attention`, `nn.MultiheadAttention`).

# %% [markdown]
# ## For readers of the original notes (原笔记勘误)
#
# This course was built from a teacher's study notes written for PyTorch 1.x, whose seq2seq chapter copies the
# classic (pre-2023) version of PyTorch's translation tutorial with the teacher's own comments. Where they say
# something that does not hold, or use a recipe that has a better replacement today, this lesson teaches today's
# version; the table maps each one.
#
# | What the notes say | What holds in PyTorch 2.14 | Where this lesson shows it |
# |---|---|---|
# | `readLangs` splits the file with `split(ceng'\n')` | A typo that is a syntax error: `split('\n')`; `read_pairs` reads the file line by line | §2 · Normalisation and loading |
# | `from __future__ import unicode_literals, print_function, division` | Unnecessary: Python 3 already behaves that way | §2 · Normalisation and loading |
# | `unicodeToAscii` + `normalizeString` as the normalisation | `œ` is a letter, not `o` plus an accent, so it is dropped and *sœur* becomes *s ur*; spell ligatures out first | §2 · Normalisation and loading |
# | All pairs train the model; `evaluateRandomly` shows `random.choice(pairs)` | Nothing is held out, so the showcase shows memorised sentences. Split by sentence into training, validation and test; show and score held-out sentences (asserted) | §3 · Train, validation and test splits; §9 · Greedy decoding and `translate()` |
# | `SOS_token = 0`, `EOS_token = 1`, vocabularies from all pairs, `word2index[word]` for every word | Batches need a padding index (0 = `<pad>`, with `padding_idx`); build vocabularies from the training split only; name unknown words in a clear error or map them to `<unk>` instead of a `KeyError` | §4 · The vocabulary: `Lang` |
# | One pair per step: the encoder called once per word on `[1, 1, 256]` tensors into a `zeros(max_length, hidden)` buffer | Batches with padding and `pack_padded_sequence`, the GRU over a whole batch in one call; more than ten times more pairs per second. The buffer raises `IndexError` for a source longer than `max_length` | §5 · Batches: padding and packing; §15 · Speed |
# | "for one GRU cell, output == hidden" | For a one-layer, one-directional GRU the output at the last step is the final state; in a padded batch only when packed, and then at each sentence's last real word | §5 · Batches: padding and packing |
# | `AttnDecoderRNN`'s weights `F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)))`, commented `??? # [1, 10]` | Location-based attention: `max_length` scores, one per source *position*, computed without reading the encoder outputs; some weight falls past the end of the sentence | §6 · The classic attention decoder scores positions |
# | `nn.LogSoftmax` output with `nn.NLLLoss`; two SGD optimisers with learning rate 0.01 | `F.cross_entropy` on logits computes the same loss in one call, with `ignore_index` for padding; one Adam (fused) over all parameters, with gradient clipping | §8 · Training: masked loss, teacher forcing, clipping |
# | `use_teacher_forcing = True` (the tutorial they copy drew it per pair with `teacher_forcing_ratio = 0.5`) | A good choice, now measured: trained on its own predictions with the same budget, the model translates far worse. The tutorial's 2023 rewrite also always teacher-forces | §14 · Teacher forcing against training on its own predictions |
# | Without teacher forcing: `decoder_input = topi.squeeze().detach()  # detach from history as input`, `break` at `<eos>`, then `loss.item() / target_length` | The argmax index has no gradient, so `.detach()` changes nothing: gradients flow through the hidden state, never through the choice of a word. Stopping at a predicted `<eos>` leaves the rest of the reference untrained, and dividing by the full length reports too low a loss; decode to the reference's length and average over real words | §14 · Teacher forcing against training on its own predictions |
# | `showPlot` calls `plt.figure()`, then `plt.subplots()` | That opens two figures, the first empty; make one with `plt.subplots()` (the course's `plot_curves`) | §8 · Training: masked loss, teacher forcing, clipping |
# | `evaluate` reads `decoder_output.data.topk(1)` and `decoder_attention.data` | `.data` is legacy and hides in-place changes from autograd; decode under `torch.no_grad()` and take `argmax` | §9 · Greedy decoding and `translate()` |
# | `evaluate` translates without `decoder.eval()` | Dropout stays on at inference: translations are noisy and change from call to call; `translate()` switches to `eval()` and back | §9 · Greedy decoding and `translate()` |
# | `showAttention`: `ax.set_xticklabels([''] + words)`, then `MultipleLocator(1)` | Matplotlib warns (`set_ticklabels() should only be used with a fixed number of ticks`); the labels land right only by luck. Set ticks and labels together: `ax.set_xticks(range(n), labels=words)` | §12 · Attention heat maps |
