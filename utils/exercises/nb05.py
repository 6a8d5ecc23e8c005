"""Checks for the exercises of notebook 05 · seq2seq translation (``notebooks/src/05_seq2seq_translation.py``).
Used by notebook 05, whose ``Checker("05")`` imports it by name. Lives in utils/ because
the checks, and with them the answers, stay out of the learner's notebook; ``make progress`` runs them too.
"""

from collections import Counter

import torch
import torch.nn.functional as F

from utils.exercises import Registry, expect, hint, returns, shape_answer
from utils.seq2seq import PAD_token

EXERCISES = Registry("05")

PADDING = "5. Batches: padding and packing"
NOTES_ATTENTION = "6. The classic attention decoder scores positions, not the words at them"
CONTEXT = "7. One decoder, three ways to choose the context"
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
            "that is the `???`: self.attn is `nn.Linear(2 * hidden_size, max_length)`, so it gives max_length = 13 "
            "scores whatever the sentence's length, one per source *position*; the encoder outputs enter only "
            "afterwards, in the `bmm`"
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
        result = returns(fn, states.clone(), keys.clone(), mask.clone())
        expect(isinstance(result, tuple) and len(result) == 2, "return a pair: (weights, context)")
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


@EXERCISES.exercise(3, "Clipped n-gram counts, batched (stretch)", BLEU)
def clipped_counts(fn):
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
            expect(
                totals == want[1], f"totals should be the number of n-grams of each hypothesis, {want[1]}, not {totals}"
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
                f"for n = {n}, the clipped matches should be {want[0]}, not {matches}: count each distinct n-gram in "
                "both sentences and add the smaller of the two counts"
            )
