"""Checks for the exercises of notebook 05 · seq2seq translation (``notebooks/src/05_seq2seq_translation.py``).
Used by notebook 05, whose ``Checker("05")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

import functools
import math
import random
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

from utils.exercises import Registry, expect, hint, returns, shape_answer
from utils.exercises.rules import calls_to, functions_reached, python_loops, refers_to, torch_calls
from utils.seq2seq import PAD_token

EXERCISES = Registry("05")

PADDING = "5. Batches: padding and packing"
NOTES_ATTENTION = "6. The classic attention decoder scores positions, not the words at them"
CONTEXT = "7. One decoder, three ways to choose the context"
TRAINING = "8. Training: masked loss, teacher forcing, clipping"
BLEU = "10. Evaluation: BLEU and exact match"
REDUCTIONS = "01 · 3. Dimensions and shapes"


@EXERCISES.exercise(1, "The `???` line (predict)", NOTES_ATTENTION)
def notes_attention_shapes(answer):
    expect(
        isinstance(answer, (list, tuple)) and len(answer) == 3,
        "give a list of three values: [shape of the input of self.attn, shape of attn_weights, number of "
        "parameters of self.attn]",
    )
    a, w, n = answer
    a, w = shape_answer(a, "the first value", "(4, 10)"), shape_answer(w, "the second value", "(4, 10)")
    expect(isinstance(n, int) and not isinstance(n, bool), "the number of parameters is an int")
    # B = 4, H = 32, max_length = 13, a source of S = 7 positions.
    if a == (4, 32):
        hint(
            "self.attn reads `torch.cat((embedded, hidden[0]), 1)`: the previous word's embedding and the decoder "
            "state side by side, 2 × 32 numbers per sentence"
        )
    if a in ((1, 4, 64), (4, 1, 64)):
        hint("`hidden[0]` drops the GRU's layer dimension and `embedded` is [B, H]: the input of self.attn is 2-D")
    expect(a == (4, 64), f"the input of self.attn should be [batch, 2 × hidden] = (4, 64), not {a}")
    if w == (4, 7):
        hint(
            "that is the `???`: self.attn is a Linear layer, and its number of outputs was fixed when the layer "
            "was built (look at its constructor in section 6), so it cannot depend on this batch's sentence "
            "length; the encoder outputs enter only afterwards, in the `bmm`"
        )
    if w in ((4, 1, 13), (1, 4, 13)):
        hint(
            "attn_weights is the softmax of self.attn's output, [batch, max_length]; the `unsqueeze(1)` comes "
            "later, for the `bmm`"
        )
    expect(w == (4, 13), f"attn_weights should be [batch, max_length], not {w}")
    if n == 64 * 13:
        hint("a Linear layer has a bias too: in × out weights + out biases")
    if n in (33 * 13, 32 * 13):
        hint(
            "this layer reads [embedded; hidden], 2 × 32 = 64 inputs (section 7's location-based attention reads "
            "the state alone, hence its (H + 1) × max_length)",
            CONTEXT,
        )
    if n in (64 * 7 + 7, 64 * 7):
        hint("the layer's size does not depend on the sentence: it has max_length = 13 outputs")
    expect(n == 64 * 13 + 13, f"{n} is not the parameter count of nn.Linear(64, 13): in × out + out")


def _code_names(f) -> set[str]:
    """The global names that ``f``'s code (and its nested functions') uses, to find a function that calls itself."""
    names, stack = set(), [f.__code__]
    while stack:
        code = stack.pop()
        names |= set(code.co_names)
        stack += [c for c in code.co_consts if hasattr(c, "co_names")]
    return names


def _reference_attention(states, keys, mask, scale=1.0, mask_of=None, dim=-1):
    scores = states @ keys.transpose(1, 2) * scale
    m = mask.unsqueeze(1) if mask_of is None else mask_of
    weights = F.softmax(scores.masked_fill(~m, float("-inf")), dim=dim)
    return weights, weights @ keys


@EXERCISES.exercise(2, "Luong's dot attention, masked (write a function)", CONTEXT)
def dot_attention(fn):
    cases = [  # (B, T, S, H, lengths): B == T in the first, so a mask broadcast on the wrong axis still runs
        (3, 3, 5, 8, [5, 2, 4]),
        (2, 4, 6, 4, [3, 6]),
        (4, 1, 5, 16, [1, 5, 2, 3]),  # one decoding step (T = 1), a one-word sentence
    ]
    for b, t, s, h, lengths in cases:
        g = torch.Generator().manual_seed(b * 100 + t)
        states, keys = torch.randn(b, t, h, generator=g), torch.randn(b, s, h, generator=g)
        mask = torch.arange(s) < torch.tensor(lengths).unsqueeze(1)  # [B, S], True at real words
        keys = keys * mask.unsqueeze(-1)  # zeros at padding, as pad_packed_sequence leaves them
        expected_w, expected_c = _reference_attention(states, keys, mask)
        with calls_to(fn) as entered:
            result = returns(fn, states.clone(), keys.clone(), mask.clone())
        expect(isinstance(result, tuple) and len(result) == 2, "return a pair: (weights, context)")
        if loops := python_loops(fn):
            hint(
                f"{loops[0]}: the task asks for no Python loop. Section 7 computes attention for every decoder step "
                "of every sentence in one batched expression: `@` multiplies each sentence's [T, H] by its "
                "[H, S] at once, and a loop over sentences or steps calls small operations one by one, the cost "
                "section 15 measures",
            )
        recursive = [
            f.__name__
            for f in functions_reached(fn)
            if f.__globals__.get(f.__name__) is f and f.__name__ in _code_names(f)
        ]
        if sum(entered.values()) > 1 or recursive:
            hint(
                f"`{(recursive or [fn.__name__])[0]}` calls itself: a recursion over parts of the batch is a Python "
                "loop written another way, one small call per part. Section 7 computes attention for every "
                "decoder step of every sentence in one batched expression: `@` multiplies each sentence's [T, H] "
                "by its [H, S] at once",
            )
        weights, context = result
        expect(isinstance(weights, torch.Tensor) and isinstance(context, torch.Tensor), "return two tensors")
        if tuple(weights.shape) == (b, t, h) and tuple(context.shape) == (b, t, s) and h != s:
            hint("the pair is in the wrong order: return (weights, context)")
        if tuple(weights.shape) == (b, s, t) and s != t:
            hint(
                f"the weights have shape [B, S, T] = {tuple(weights.shape)}: score states against keys, "
                "`states @ keys.transpose(1, 2)`, so that each decoder step gets a row of S weights"
            )
        expect(
            tuple(weights.shape) == (b, t, s),
            f"the weights should have shape [B, T, S] = {(b, t, s)}, not {tuple(weights.shape)}",
        )
        expect(
            tuple(context.shape) == (b, t, h),
            f"the context should have shape [B, T, H] = {(b, t, h)}, not "
            f"{tuple(context.shape)}: it is the weights times the keys, `weights @ keys`",
        )
        expect(
            weights.dtype == states.dtype,
            f"keep the dtype: the weights are {weights.dtype}, the states {states.dtype}",
            "01 · 2. Data types",
        )
        if torch.allclose(weights, expected_w, atol=1e-5) and torch.allclose(context, expected_c, atol=1e-5):
            continue
        over_steps = _reference_attention(states, keys, mask, dim=1)[0]
        if t > 1 and (
            torch.allclose(weights, over_steps, atol=1e-5, equal_nan=True)
            or (
                torch.allclose(weights.sum(1), torch.ones(b, s), atol=1e-5)
                and not torch.allclose(weights.sum(-1), torch.ones(b, t), atol=1e-5)
            )
        ):
            hint(
                "the softmax ran over the decoder steps (dim 1): each step's weights over the source positions "
                "must sum to 1, so take it over the last dimension"
            )
        if (weights <= 0).all() and torch.allclose(weights.exp(), expected_w, atol=1e-5):
            hint(
                "these are log-weights (`log_softmax`, as the decoders' outputs): attention weights are "
                "probabilities, `F.softmax(..., dim=-1)`"
            )
        if torch.isnan(weights).any():
            hint(
                "some weights are NaN: a row whose scores are all -inf has no softmax. The mask is True at real "
                "words: fill the scores where it is *False*, `masked_fill(~mask, float('-inf'))`"
            )
        sums = weights.sum(-1)
        if t == b and torch.allclose(
            weights, _reference_attention(states, keys, mask, mask_of=mask.unsqueeze(0))[0], atol=1e-5
        ):
            hint(
                "the mask [B, S] was broadcast against the scores [B, T, S] from the right, so it lined up with the "
                "steps T instead of the batch: insert the step axis, `mask.unsqueeze(1)` ([B, 1, S])",
                "01 · 7. Broadcasting (广播) and matrix products (矩阵乘法)",
            )
        padded = weights.masked_select(~mask.unsqueeze(1).expand(b, t, s))
        if padded.numel() and padded.abs().max() > 1e-6:
            if torch.allclose(weights, F.softmax(states @ keys.transpose(1, 2), -1), atol=1e-5):
                hint(
                    "padded positions got weight: set their scores to -inf before the softmax (a score of 0 still "
                    "gets weight, since exp(0) = 1)"
                )
            hint("padded positions must get weight 0: set their scores to -inf (not 0) before the softmax")
        if not torch.allclose(sums, torch.ones(b, t), atol=1e-5):
            hint(
                "each step's weights must sum to 1: mask the *scores* before the softmax; zeroing weights after it "
                "leaves rows that sum to less than 1"
            )
        if torch.allclose(weights, _reference_attention(states, keys, mask, scale=h**-0.5)[0], atol=1e-5):
            hint("that is the Transformer's scaled dot product (divided by √H); Luong's dot score is just s_t · h_j")
        expect(
            torch.allclose(weights, expected_w, atol=1e-5),
            "the weights differ: score each decoder state "
            "against each source output with a dot product, `states @ keys.transpose(1, 2)`, mask, then "
            "softmax over the source positions",
        )
        hint("the weights are right but the context is not: it is the weighted sum of the keys, `weights @ keys`")


@functools.cache
def _lesson_batches():
    """Notebook 05's code (its shared cells), a model built by its ``build_model`` and two real batches of its
    training split: one of 80 pairs in random order (much padding), one of 5 pairs."""
    from tools import lesson_code
    from utils.seq2seq import CORPUS_FILE, batch_tensors, build_langs, filter_pairs, read_pairs, split_pairs

    lesson = lesson_code.load("05_seq2seq_translation")
    train, _, _ = split_pairs(filter_pairs(read_pairs(CORPUS_FILE, reverse=True)), (0.8, 0.1, 0.1), seed=0)
    src_lang, tgt_lang = build_langs(train, "fra", "eng")
    pairs = random.Random(5).sample(train, 85)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = lesson.build_model("content", src_lang, tgt_lang, hidden_size=112, dropout_p=0.0).eval()
    cases = []
    for chunk in (pairs[:80], pairs[80:]):
        batch = batch_tensors(chunk, src_lang, tgt_lang)
        with torch.no_grad():
            logits, _ = model(batch.src, batch.src_lengths, batch.tgt)
            alone = []  # section 8's check: each sentence through the model on its own, no padding anywhere
            for pair in chunk:
                one = batch_tensors([pair], src_lang, tgt_lang)
                alone.append(F.cross_entropy(model(one.src, one.src_lengths, one.tgt)[0][0], one.tgt[0]))
        cases.append((lesson, batch, logits, torch.stack(alone)))
    return cases


class _FixedLogits(nn.Module):
    """A "model" whose forward returns the same logits: to run the lesson's own ``train_step`` on them."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())

    def forward(self, src, src_lengths, tgt):
        return self.logits, None


def _train_step_loss(lesson, batch, logits: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The loss the lesson's ``train_step`` computes on ``logits``, and its gradient with respect to them."""
    fixed = _FixedLogits(logits)
    loss, _ = lesson.train_step(fixed, batch, torch.optim.SGD(fixed.parameters(), lr=0.0), clip=math.inf)
    return loss, fixed.logits.grad


def _call_masked(fn, logits: torch.Tensor, tgt: torch.Tensor):
    try:
        return returns(fn, logits, tgt)
    except RuntimeError as err:
        if "expected target size" in str(err).lower():
            hint(
                "`F.cross_entropy` wants the classes in dimension 1: [N, V] logits with [N] targets, or "
                "[B, V, T] with [B, T]. Flatten the batch and the steps together, `logits.flatten(0, 1)` and "
                "`tgt.flatten()`, as `train_step` does, and reshape the result back to [B, T]"
            )
        raise


@EXERCISES.exercise(3, "The loss over real words, per sentence and per batch (write a function)", TRAINING)
def masked_losses(fn):
    _call_masked(fn, torch.zeros(2, 3, 5), torch.tensor([[4, 2, 0], [4, 4, 2]]))  # an untouched stub stops here
    for lesson, batch, logits, alone in _lesson_batches():
        tgt, (b, t, _) = batch.tgt, logits.shape
        real = tgt != PAD_token
        lengths = real.sum(1)
        expected_mean, expected_grad = _train_step_loss(lesson, batch, logits)
        leaf = logits.clone().requires_grad_()
        with torch_calls() as called:
            result = _call_masked(fn, leaf, tgt.clone())
        expect(isinstance(result, tuple) and len(result) == 2, "return a pair: `(per_sentence, mean)`")
        per_sentence, mean = result
        if loops := python_loops(fn):
            hint(
                f"{loops[0]}: the task asks for no Python loop. The losses of every position of every sentence come "
                'from one call, `F.cross_entropy(..., reduction="none")`; the mask then picks the real words and '
                "sums over dimension 1 reduce each sentence (01's reductions)",
            )
        if (losses := called["cross_entropy"] + called["nll_loss"]) > 1:
            hint(
                f"the loss function ran {losses} times: the task asks for one call of `F.cross_entropy`. Its "
                "per-position losses already hold what `mean` needs, the real words' losses and their number; "
                "a second call computes the log-softmax over the whole vocabulary at every position of the "
                "batch again, the largest tensor of the step. Compute `mean` from the masked per-position losses"
            )
        expect(
            isinstance(per_sentence, torch.Tensor) and tuple(per_sentence.shape) == (b,),
            f"`per_sentence` should be a tensor of shape [B] = ({b},), one loss per sentence, not "
            f"{tuple(per_sentence.shape) if isinstance(per_sentence, torch.Tensor) else type(per_sentence).__name__}",
        )
        if not isinstance(mean, torch.Tensor):
            hint(
                f"`mean` is a {type(mean).__name__}: it is the loss that `backward()` will be called on, so it must be "
                "a tensor still attached to the logits' graph (no `.item()`)"
            )
        expect(mean.dim() == 0, f"`mean` should be one number, a 0-d tensor, not a tensor of shape {tuple(mean.shape)}")
        expect(
            mean.requires_grad,
            "`mean` does not require a gradient: it was detached from the logits (`.detach()`, `.data`, "
            "`torch.tensor(...)` of a number, or `torch.no_grad()`), so `backward()` could not train the model",
        )
        per_position = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view(b, t)
        with torch.no_grad():
            got, m = per_sentence.detach().double(), float(mean)
        if not torch.allclose(got, alone.double(), rtol=1e-4, atol=1e-4):
            padded_means = (per_position.mean(1), (per_position * real).sum(1) / t)  # padding's loss, or zeros
            if any(torch.allclose(got, p.double(), rtol=1e-4, atol=1e-4) for p in padded_means):
                hint(
                    "`per_sentence` counts the padding: each sentence's mean is over its real words only, the sum of "
                    "their losses divided by its length, not by the padded width T",
                    PADDING,
                )
            if torch.allclose(got, (per_position * real).sum(1).double(), rtol=1e-4, atol=1e-4):
                hint("`per_sentence` is each sentence's *sum* over its words: divide by its number of real words")
            if torch.allclose(got, (per_position * ~real).sum(1).double() / (~real).sum(1).clamp(min=1), atol=1e-4):
                hint("the mask is the wrong way round: `tgt != PAD_token` is True at the real words")
            softmaxed = F.cross_entropy(logits.softmax(-1).flatten(0, 1), tgt.flatten(), reduction="none")
            if torch.allclose(got, (softmaxed.view(b, t) * real).sum(1).double() / lengths, atol=1e-4):
                hint("the loss was computed on softmax outputs: `F.cross_entropy` takes the logits")
            hint(
                "`per_sentence` differs from the lesson's: section 8 computes each sentence's loss by running it "
                "alone through the model; your value for the whole batch should equal it. Take the loss at every "
                'position (`reduction="none"`), keep the real words (`tgt != PAD_token`) and average each row '
                "over its real words"
            )
        if abs(m - expected_mean) > 1e-4 * max(1.0, abs(expected_mean)):
            if any(abs(m - p.item()) < 1e-4 for p in (per_position.mean(), (per_position * real).sum() / (b * t))):
                hint(
                    "`mean` counts the padding: it is the mean over the batch's real words, what "
                    "`ignore_index=PAD_token` gives `train_step`"
                )
            if abs(m - alone.mean().item()) < 1e-4 and abs(alone.mean().item() - expected_mean) > 1e-4:
                hint(
                    "`mean` is the mean of the sentences' means, which gives a short sentence's words more weight "
                    "than a long one's: `train_step`'s loss is the mean over all the real words of the batch. "
                    "Weight each sentence by its number of words"
                )
            hint(
                f"`mean` is not {m:.4f}, the loss `train_step` computes with `ignore_index`: the sum of the real "
                "words' losses divided by their number"
            )
        (grad,) = torch.autograd.grad(mean, leaf, allow_unused=True)
        expect(
            grad is not None and torch.allclose(grad, expected_grad, rtol=1e-3, atol=1e-7),
            "`mean` has the right value but not the right gradient: compute it from the logits with tensor "
            "operations all the way, without numbers taken out of the graph",
        )


def _ngrams(ids: list[int], n: int) -> Counter:
    words = [w for w in ids if w != PAD_token]
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def _reference_counts(hyp, ref, n, clip=True, pad=False):
    matches, totals = [], []
    for h, r in zip(hyp.tolist(), ref.tolist()):
        if pad:  # padding treated as a word
            hc = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
        else:
            hc, rc = _ngrams(h, n), _ngrams(r, n)
        matches.append(sum((hc & rc).values()) if clip else sum(c for g, c in hc.items() if g in rc))
        totals.append(sum(hc.values()))
    return matches, totals


def _padded(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([row + [PAD_token] * (width - len(row)) for row in rows])


def _as_list(value, name: str, b: int) -> list:
    if isinstance(value, (list, tuple)):
        value = torch.tensor(value)
    expect(isinstance(value, torch.Tensor), f"{name} should be a tensor, not a {type(value).__name__}")
    if value.dim() == 0:
        hint(
            f"{name} is one number for the whole batch: return one count per sentence, shape [B] (reduce over "
            "the positions of each sentence, not over the batch)",
            REDUCTIONS,
        )
    expect(
        tuple(value.shape) == (b,),
        f"{name} should have shape [B] = ({b},), one count per sentence, not {tuple(value.shape)}",
        REDUCTIONS,
    )
    return value.tolist()


@EXERCISES.exercise(4, "Clipped n-gram counts, batched (stretch)", BLEU)
def clipped_counts(fn):
    if library := refers_to(fn, "sacrebleu", "sentence_bleu", "corpus_bleu", "BLEU", "extract_all_word_ngrams"):
        named = "" if library == "sacrebleu" else f" (`{library}`)"
        hint(
            f"your function uses sacrebleu{named}, which counts the n-grams for you: the exercise is to count and "
            "clip them yourself, to see what BLEU's precision is made of. Section 10 uses sacrebleu to check such "
            "counts, not to make them"
        )
    the = [5, 5, 5, 5]  # "the the the the" against "the cat is here"
    cases = [
        (_padded([the], 4), _padded([[5, 6, 7, 8]], 4)),
        (
            _padded([[4, 5, 4, 4, 6], [7, 7], [5, 6, 5, 6, 5, 6, 4], [8, 4, 6]], 7),
            _padded([[4, 4, 5, 6], [7, 9, 7, 7], [6, 5, 6], [4, 8, 6, 4, 9]], 5),
        ),
    ]
    g = torch.Generator().manual_seed(5)
    rows = [
        [int(w) for w in torch.randint(4, 8, (int(length),), generator=g)]
        for length in torch.randint(2, 9, (12,), generator=g)
    ]
    cases.append((_padded(rows[:6], 9), _padded(rows[6:], 8)))
    rows = [
        [int(w) for w in torch.randint(4, 40, (int(length),), generator=g)]  # ids past 9: a real vocabulary
        for length in torch.randint(2, 9, (8,), generator=g)
    ]
    rows[4] = rows[0][::-1]  # the same pairs reversed: a pair code that forgets the order matches them
    # (4, 25) and (6, 5) are different bigrams that `10 * a + b` would both turn into 65
    cases.append((_padded(rows[:4] + [[4, 25, 7]], 8), _padded(rows[4:] + [[6, 5, 7]], 8)))
    # an empty hypothesis (greedy decoding that stopped at once) and a one-word one: fewer words than n
    cases.append((_padded([[], [5], [5, 6], [6, 5, 6]], 4), _padded([[5], [5, 6], [5], [5, 6]], 3)))
    for n in (1, 2):
        for hyp, ref in cases:
            b = hyp.shape[0]
            result = returns(fn, hyp.clone(), ref.clone(), n)
            expect(isinstance(result, tuple) and len(result) == 2, "return a pair: (matches, totals)")
            got = _as_list(result[0], "matches", b), _as_list(result[1], "totals", b)
            want = _reference_counts(hyp, ref, n)
            if got == want:
                continue
            matches, totals = got
            with_pad = _reference_counts(hyp, ref, n, pad=True)
            if got == with_pad or (totals == with_pad[1] != want[1]):
                hint(
                    "padding was counted as a word: leave out every n-gram that contains PAD_token (0), in the "
                    "hypotheses and in the references",
                    PADDING,
                )
            unigrams = _reference_counts(hyp, ref, 1)
            if n == 2 and got == unigrams:
                hint("for n = 2 these are unigram counts: count the pairs of neighbouring words")
            if totals == _reference_counts(ref, hyp, n)[1] != want[1]:
                hint(
                    "totals counts the reference's n-grams: precision divides by the hypothesis's n-grams (dividing "
                    "by the reference's would be recall)"
                )
            if n == 2 and totals == unigrams[1]:
                hint("a sentence of L words has L - n + 1 n-grams, not L")
            if min(totals) < 0:
                hint(
                    f"totals holds a negative count, {min(totals)}: a hypothesis with fewer than n words (an empty "
                    "translation, say) has no n-gram at all, not a negative number of them"
                )
            expect(
                totals == want[1],
                f"totals should be the number of n-grams of each hypothesis (padding is not a word), not {totals}",
            )
            if matches == _reference_counts(hyp, ref, n, clip=False)[0]:
                hint(
                    "the matches are not clipped: an n-gram counts at most as often as it occurs in the reference, "
                    "so 'the the the the' against 'the cat is here' matches 1 unigram, not 4"
                )
            if n == 2 and all(m >= w for m, w in zip(matches, want[0])):
                hint(
                    "some different pairs were counted as the same bigram: when you turn a pair of ids (a, b) into "
                    "one number, it must be unique, `a * V + b` with V larger than every id (not a fixed 10, not "
                    "a + b)"
                )
            hint(
                f"for n = {n}, the clipped matches are not {matches}: count each distinct n-gram in both sentences "
                "and add the smaller of the two counts"
            )
