import random

import pytest
import torch

from tools.lesson_code import load
from utils.seq2seq import (
    ENG_PREFIXES,
    EOS_token,
    Lang,
    PAD_token,
    SOS_token,
    UNK_token,
    UnknownWordError,
    batch_tensors,
    build_langs,
    filter_pairs,
    make_batches,
    normalize_string,
    read_pairs,
    split_pairs,
    unicode_to_ascii,
)

lesson = load("05_seq2seq_translation")  # the models as notebook 05 writes them


def test_normalize_string_follows_the_notes():
    assert normalize_string("Ne l'a-t-elle pas vue ?") == "ne l a t elle pas vue ?"
    assert normalize_string("  Il fait froid!  ") == "il fait froid !"
    assert normalize_string("J'ai 10 ans.") == "j ai ans ."  # digits are not letters (as in the notes)


def test_ligatures_are_spelled_out():
    assert unicode_to_ascii("sœur Æsop") == "soeur AEsop"
    assert normalize_string("Ma sœur est là.") == "ma soeur est la ."
    with pytest.raises(TypeError, match="expects a str"):
        normalize_string(3)  # type: ignore[arg-type]


def _write_tatoeba(path):
    # the real file: English, French, attribution (CC-BY), UTF-8 with accents
    rows = [
        "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wittydev)",
        "I'm cold.\tJ'ai froid.\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)",
        "He's my brother.\tC'est mon frère.\tCC-BY 2.0 (France) Attribution: tatoeba.org #3 (a) & #4 (b)",
        "",
        "She is my sister, and she is older than me by five years.\tC'est ma sœur, elle a cinq ans de plus que moi.\tx",
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_read_pairs_reads_a_real_tatoeba_file(tmp_path):
    f = tmp_path / "eng-fra.txt"
    _write_tatoeba(f)
    pairs = read_pairs(f)
    assert pairs[0] == ("va !", "go .")
    assert pairs[1] == ("j ai froid .", "i m cold .")
    assert len(pairs) == 4  # the blank line is skipped
    assert read_pairs(f, reverse=False)[2] == ("he s my brother .", "c est mon frere .")
    kept = filter_pairs(pairs, max_length=10, prefixes=ENG_PREFIXES)
    assert kept == [("j ai froid .", "i m cold ."), ("c est mon frere .", "he s my brother .")]
    assert filter_pairs(pairs, max_length=10) == pairs[:3]  # the long one is dropped


def test_read_pairs_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no corpus file"):
        read_pairs(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("only one column\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: expected English<TAB>French"):
        read_pairs(bad)
    with pytest.raises(ValueError, match="max_length"):
        filter_pairs([], max_length=1)


def test_split_pairs_keeps_shared_sentences_together():
    pairs = [
        ("tu es fatigue .", "you are tired ."),
        ("vous etes fatigue .", "you are tired ."),
        ("vous etes fatigues .", "you are tired ."),
    ] + [(f"f{i}", f"e{i}") for i in range(97)]
    train, val, test = split_pairs(pairs, (0.5, 0.25, 0.25), seed=1)
    assert sorted(train + val + test) == sorted(pairs)
    for part in (train, val, test):
        tired = [p for p in part if p[1] == "you are tired ."]
        assert len(tired) in (0, 3)
    assert split_pairs(pairs, (0.5, 0.25, 0.25), seed=1) == (train, val, test)
    with pytest.raises(ValueError, match="summing to 1"):
        split_pairs(pairs, (0.5, 0.5, 0.5))


def test_lang_specials_encode_decode_and_unknown_words():
    lang = Lang("fra")
    assert lang.n_words == 4 and lang.index2word[PAD_token] == "<pad>" and lang.index2word[SOS_token] == "<sos>"
    lang.add_sentence("je suis froid .")
    lang.add_sentence("je suis la .")
    assert lang.n_words == 4 + 5 and lang.word2count["je"] == 2
    ids = lang.encode("je suis la .")
    assert ids[-1] == EOS_token and lang.decode(ids + [PAD_token, 7]) == ["je", "suis", "la", "."]
    with pytest.raises(UnknownWordError, match=r"2 word\(s\) not in the fra vocabulary of 5 words: 'tu', 'es'"):
        lang.encode("tu es la .")
    assert lang.encode("tu es la .", unknown="unk")[:2] == [UNK_token, UNK_token]
    with pytest.raises(ValueError, match="unknown must be"):
        lang.encode("je", unknown="skip")
    with pytest.raises(TypeError):
        Lang(3)  # type: ignore[arg-type]


PAIRS = [
    ("je suis froid .", "i am cold ."),
    ("il a faim .", "he is hungry ."),
    ("je la vois .", "i see her ."),
    ("nous avons dix ans .", "we are ten years old ."),
]


def test_batches_are_padded_and_bucketed():
    src, tgt = build_langs(PAIRS)
    b = batch_tensors([PAIRS[3], PAIRS[0]], src, tgt)
    assert b.src.shape == (2, 6) and b.src_lengths.tolist() == [6, 5]
    assert b.src[1, 5].item() == PAD_token and b.src[1, 4].item() == EOS_token and b.tgt.shape == (2, 7)
    batches = make_batches(PAIRS, src, tgt, 3, random.Random(0))
    assert sorted(len(x.src) for x in batches) == [1, 3]
    with pytest.raises(ValueError, match="batch_size"):
        make_batches(PAIRS, src, tgt, 0)
    with pytest.raises(ValueError, match="at least one pair"):
        batch_tensors([], src, tgt)


def test_encoder_packs_padding_away():
    torch.manual_seed(0)
    enc = lesson.Encoder(20, 8)
    src = torch.tensor([[5, 6, 7, EOS_token], [8, 9, EOS_token, PAD_token]])
    out, hidden = enc(src, torch.tensor([4, 3]))
    assert torch.all(out[1, 3] == 0)  # padded position: zero output
    alone_out, alone_hidden = enc(src[1:, :3], torch.tensor([3]))
    torch.testing.assert_close(hidden[:, 1], alone_hidden[:, 0])  # padding never reached the state
    torch.testing.assert_close(out[1, :3], alone_out[0])


def test_the_three_attentions():
    torch.manual_seed(0)
    keys = torch.randn(2, 5, 8)
    states = torch.randn(2, 3, 8)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    perm = torch.tensor([4, 2, 0, 1, 3])
    for attention in lesson.ATTENTION.values():
        w = attention(8)(states, keys, mask)
        assert w.shape == (2, 3, 5)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3))
        assert torch.all(w[1, :, 3:] == 0)  # padding gets no weight
    none = lesson.NoAttention(8)(states, keys, mask)
    assert torch.all(none[0, :, 4] == 1) and torch.all(none[1, :, 2] == 1)  # all on the last real word
    content, location = lesson.ContentAttention(8), lesson.LocationAttention(8)
    full = torch.ones(1, 5, dtype=torch.bool)
    # content-based: permuting the encoder outputs permutes the weights; location-based: nothing moves
    torch.testing.assert_close(
        content(states[:1], keys[:1, perm], full), content(states[:1], keys[:1], full)[..., perm]
    )
    torch.testing.assert_close(location(states[:1], keys[:1, perm], full), location(states[:1], keys[:1], full))
    with pytest.raises(ValueError, match="attention must be one of"):
        lesson.Decoder(10, 8, "luong")


def test_models_start_equal_except_the_score():
    src, tgt = build_langs(PAIRS)
    weights = {}
    for name in lesson.ATTENTION:
        torch.manual_seed(0)
        weights[name] = lesson.build_model(name, src, tgt, hidden_size=8).state_dict()
    shared = weights.pop("none")  # the model without attention has only the shared weights
    assert {name: sorted({k.split(".")[2] for k in set(state) - set(shared)}) for name, state in weights.items()} == {
        "location": ["score"],
        "content": ["U", "W", "v"],
    }
    for name, state in weights.items():
        assert [k for k, v in shared.items() if not torch.equal(v, state[k])] == [], name


def test_models_learn_a_tiny_corpus_and_translate():
    src, tgt = build_langs(PAIRS)
    for name in ("content", "location"):
        torch.manual_seed(0)
        model = lesson.build_model(name, src, tgt, hidden_size=24, dropout_p=0.0)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        batch = batch_tensors(PAIRS, src, tgt)
        first, _ = lesson.train_step(model, batch, opt)
        for _ in range(40):
            last, norm = lesson.train_step(model, batch, opt)
        assert last < first / 10 and norm > 0
        scores = lesson.evaluate(model, PAIRS, src, tgt)
        assert scores.exact == 1.0 and scores.bleu == pytest.approx(100.0)
        [(words, attn)] = lesson.translate(model, ["Je la vois."], src, tgt)
        assert words == ["i", "see", "her", "."] and attn.shape == (5, 5)
        torch.testing.assert_close(attn.sum(1), torch.ones(5))
    with pytest.raises(UnknownWordError, match="'chien'"):
        lesson.translate(model, ["Je vois le chien."], src, tgt)
    with pytest.raises(ValueError, match="reads at most 13"):
        lesson.translate(model, [" ".join(["je"] * 13)], src, tgt)


def test_teacher_forcing_feeds_the_target_shifted_right():
    src, tgt = build_langs(PAIRS)
    torch.manual_seed(0)
    model = lesson.build_model("content", src, tgt, hidden_size=8, dropout_p=0.0).eval()
    batch = batch_tensors(PAIRS[:2], src, tgt)
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt)
    # step by step with the true previous words gives the same logits as the one-call pass
    enc_out, hidden = model.encoder(batch.src, batch.src_lengths)
    previous = torch.full((2, 1), SOS_token)
    for t in range(batch.tgt.shape[1]):
        step, hidden, _ = model.decoder(previous, hidden, enc_out, batch.src != PAD_token)
        torch.testing.assert_close(step[:, 0], logits[:, t])
        previous = batch.tgt[:, t : t + 1]


def test_notes_style_step_trains_one_pair():
    torch.manual_seed(0)
    src, tgt = build_langs(PAIRS)
    model = lesson.build_model("content", src, tgt, hidden_size=16, dropout_p=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s, t = torch.tensor(src.encode(PAIRS[0][0])), torch.tensor(tgt.encode(PAIRS[0][1]))
    losses = [lesson.train_one_pair(model, s, t, opt) for _ in range(30)]
    assert losses[-1] < losses[0] / 2


def test_lesson_code_errors():
    from tools import lesson_code

    with pytest.raises(FileNotFoundError, match="no notebook source"):
        lesson_code.load("99_missing")
    assert lesson_code.shared_cells('# %% [markdown] tags=["shared"]\n# x = 1\n# %%\nx = 1\n') == []
    assert lesson_code.shared_cells('# %% tags=["shared"]\ny = 2\n\n# %%\nz = 3\n') == ["y = 2"]


# --------------------------------------------------------------------------------------------
# Bad arguments get a clear error (issue 14, "Public helpers")
# --------------------------------------------------------------------------------------------


def test_split_pairs_refuses_nan_fractions():
    # every comparison with NaN is False, so "f < 0" and "|sum - 1| > tol" both let NaN through
    for fractions in ((float("nan"), 0.5, 0.5), (0.8, 0.1, float("nan")), (1.0, float("-inf"), 0.0)):
        with pytest.raises(ValueError, match="three non-negative numbers summing to 1"):
            split_pairs(PAIRS, fractions)


def test_decode_names_an_index_outside_the_vocabulary():
    lang = Lang("eng")
    lang.add_sentence("i am cold .")
    with pytest.raises(IndexError, match=r"index 999 is not in the eng vocabulary \(indices 0 to 7\)"):
        lang.decode([4, 999])
    with pytest.raises(IndexError, match="index -1"):
        lang.decode([-1])
    with pytest.raises(ValueError, match=r"one sentence: a 1-D sequence of indices, got shape \(2, 3\)"):
        lang.decode(torch.tensor([[4, 5, 2], [6, 7, 2]]))  # a batch, as greedy decoding returns it


def test_lang_refuses_empty_and_non_str_sentences():
    lang = Lang("fra")
    lang.add_sentence("je suis la .")
    for bad in ("", "   "):
        with pytest.raises(ValueError, match="empty sentence"):
            lang.encode(bad)
        with pytest.raises(ValueError, match="empty sentence"):
            lang.add_sentence(bad)
    with pytest.raises(TypeError, match="a sentence must be a str, got int"):
        lang.encode(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a sentence must be a str, got list"):
        lang.add_sentence(["je", "suis"])  # type: ignore[arg-type]
    assert lang.n_words == 4 + 4  # nothing was added by the refused calls


def test_filter_pairs_refuses_one_str_as_prefixes():
    # a str is a sequence of letters: prefixes="i am " kept every English sentence starting with i, space, a or m
    with pytest.raises(TypeError, match="prefixes must be a sequence of str"):
        filter_pairs(PAIRS, prefixes="i am ")  # type: ignore[arg-type]
    assert filter_pairs(PAIRS, prefixes=["i am "]) == PAIRS[:1]


def test_make_batches_refuses_a_seed_for_rng():
    src, tgt = build_langs(PAIRS)
    with pytest.raises(TypeError, match=r"rng must be a random.Random \(e.g. random.Random\(0\)\) or None, got 0"):
        make_batches(PAIRS, src, tgt, 2, 0)  # type: ignore[arg-type]


def _tiny_model(attention="content"):
    src, tgt = build_langs(PAIRS)
    torch.manual_seed(0)
    return lesson.build_model(attention, src, tgt, hidden_size=8), src, tgt


def test_translate_refuses_one_str_and_empty_sentences():
    model, src, tgt = _tiny_model()
    with pytest.raises(TypeError, match=r"a list of sentences, got one str: write translate\(model, \['je suis"):
        lesson.translate(model, "je suis froid .", src, tgt)  # would have translated 'j', 'e', ' ', ...
    for empty in ("", "  ", "123"):  # "123" has no letters: normalisation leaves nothing
        with pytest.raises(ValueError, match="empty sentence"):
            lesson.translate(model, ["je suis froid .", empty], src, tgt)


def test_b3_translate_refuses_what_is_not_a_list_of_sentences():
    """Probe B3: None and bytes named as the wrong type of `sentences` (not `len()` of None, not an int)."""
    model, src, tgt = _tiny_model()
    for bad, kind in ((None, "NoneType"), (b"je suis", "bytes"), (iter(["je suis"]), "list_iterator")):
        with pytest.raises(TypeError, match=rf"translate\(\) takes a list of sentences \(str\), got {kind}"):
            lesson.translate(model, bad, src, tgt)


def test_b12_evaluate_refuses_no_pairs():
    """Probe B12: evaluate(model, []) named the empty argument, not an IndexError inside sacrebleu."""
    model, src, tgt = _tiny_model()
    with pytest.raises(ValueError, match=r"evaluate\(\) needs at least one pair \(source, reference\) in pairs"):
        lesson.evaluate(model, [], src, tgt)


def test_translate_gives_the_model_back_in_its_mode():
    model, src, tgt = _tiny_model()
    for training in (True, False):
        model.train(training)
        lesson.translate(model, ["je suis froid ."], src, tgt)
        assert model.training == training
        lesson.evaluate(model, PAIRS, src, tgt)
        assert model.training == training
        with pytest.raises(UnknownWordError):  # and when translating fails half-way
            lesson.translate(model, ["je suis froid .", "le chien ."], src, tgt, batch_size=1)
        assert model.training == training


def test_greedy_refuses_max_length_below_one():
    model, src, _ = _tiny_model()
    b = torch.tensor([src.encode("je suis froid .")])
    with pytest.raises(ValueError, match="max_length must be at least 1, got 0"):
        model.greedy(b, torch.tensor([b.shape[1]]), max_length=0)
    assert model.greedy(b, torch.tensor([b.shape[1]]), max_length=1)[0].shape == (1, 1)


def test_location_attention_refuses_sources_longer_than_max_length():
    torch.manual_seed(0)
    long_source = torch.randn(1, lesson.MAX_LENGTH + 2, 8)  # 15 positions, 13 slots
    decoder = lesson.ClassicAttnDecoderRNN(8, 20).eval()
    message = r"15 source positions, but this location-based attention scores only max_length=13"
    with pytest.raises(ValueError, match=message):  # before: F.pad cropped the last two positions silently
        decoder(torch.tensor([SOS_token]), torch.zeros(1, 1, 8), long_source)
    with pytest.raises(ValueError, match=message):  # before: a size mismatch inside masked_fill
        lesson.LocationAttention(8)(torch.randn(1, 2, 8), long_source, torch.ones(1, 15, dtype=torch.bool))
    # up to max_length positions still work
    assert decoder(torch.tensor([SOS_token]), torch.zeros(1, 1, 8), long_source[:, :13])[2].shape == (1, 13)


def test_free_running_step_feeds_back_its_own_predictions():
    src, tgt = build_langs(PAIRS)
    torch.manual_seed(0)
    model = lesson.build_model("content", src, tgt, hidden_size=8, dropout_p=0.0).eval()
    batch = batch_tensors(PAIRS, src, tgt)
    frozen = torch.optim.SGD(model.parameters(), lr=0.0)  # a step that changes nothing
    forced, _ = lesson.train_step(model, batch, frozen)
    # ratio 1: the true previous word at every step, so the same loss as the one-call teacher-forced pass
    assert lesson.train_step_free_running(model, batch, frozen, ratio=1.0)[0] == pytest.approx(forced, rel=1e-5)
    # ratio 0: its own (untrained) predictions, another loss; the step leaves the model in training mode
    model.eval()
    assert lesson.train_step_free_running(model, batch, frozen, ratio=0.0)[0] != pytest.approx(forced, rel=1e-3)
    assert model.training
    torch.manual_seed(0)
    learner = lesson.build_model("content", src, tgt, hidden_size=24, dropout_p=0.0)
    opt = torch.optim.Adam(learner.parameters(), lr=0.02)
    losses = [lesson.train_step_free_running(learner, batch, opt)[0] for _ in range(60)]
    assert losses[-1] < losses[0] / 5


def test_b12_aside_a_double_space_is_named_not_an_unknown_empty_word():
    """Probe B12's aside: Lang.encode("je  suis") said the word '' was not in the vocabulary."""
    src, _ = build_langs(PAIRS)
    with pytest.raises(ValueError, match=r"sentence 'je  suis' has a space at its start or end, or two in a row"):
        src.encode("je  suis")
