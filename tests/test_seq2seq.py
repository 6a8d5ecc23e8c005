import random

import pytest
import torch

from utils.seq2seq import (
    ENG_PREFIXES,
    EOS_token,
    PAD_token,
    SOS_token,
    UNK_token,
    AdditiveAttention,
    EncoderRNN,
    Lang,
    NotesAttnDecoderRNN,
    UnknownWordError,
    batch_tensors,
    build_langs,
    build_model,
    evaluate,
    filter_pairs,
    make_batches,
    normalize_string,
    read_pairs,
    split_pairs,
    train_batch,
    train_pair_notes_style,
    translate,
    unicode_to_ascii,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and two threads crawl on a busy two-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    pairs = [("tu es fatigue .", "you are tired ."), ("vous etes fatigue .", "you are tired ."),
             ("vous etes fatigues .", "you are tired .")] + [(f"f{i}", f"e{i}") for i in range(97)]
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


PAIRS = [("je suis froid .", "i am cold ."), ("il a faim .", "he is hungry ."),
         ("je la vois .", "i see her ."), ("nous avons dix ans .", "we are ten years old .")]


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
    enc = EncoderRNN(20, 8)
    src = torch.tensor([[5, 6, 7, EOS_token], [8, 9, EOS_token, PAD_token]])
    out, hidden = enc(src, torch.tensor([4, 3]))
    assert torch.all(out[1, 3] == 0)  # padded position: zero output
    alone_out, alone_hidden = enc(src[1:, :3], torch.tensor([3]))
    torch.testing.assert_close(hidden[:, 1], alone_hidden[:, 0])  # padding never reached the state
    torch.testing.assert_close(out[1, :3], alone_out[0])


def test_attention_content_versus_position():
    torch.manual_seed(0)
    attn = AdditiveAttention(8, 8, 8)
    keys = torch.randn(2, 5, 8)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    ctx, w = attn(torch.randn(2, 8), keys, keys, mask)
    assert ctx.shape == (2, 8) and w.shape == (2, 5)
    torch.testing.assert_close(w.sum(1), torch.ones(2))
    assert torch.all(w[1, 3:] == 0)
    # content-based: permuting the encoder outputs permutes the weights
    q = torch.randn(1, 8)
    perm = torch.tensor([4, 2, 0, 1, 3])
    _, w1 = attn(q, keys[:1], keys[:1])
    _, w2 = attn(q, keys[:1, perm], keys[:1, perm])
    torch.testing.assert_close(w2, w1[:, perm])
    # the notes' decoder: the weights do not depend on the encoder outputs at all
    dec = NotesAttnDecoderRNN(8, 12, dropout_p=0.0, max_length=6).eval()
    h = torch.randn(1, 1, 8)
    token = torch.tensor([SOS_token])
    _, _, a1 = dec.forward_step(token, h, keys[:1])
    _, _, a2 = dec.forward_step(token, h, keys[:1, perm])
    torch.testing.assert_close(a1, a2)
    assert a1.shape == (1, 6)


def test_models_learn_a_tiny_corpus_and_translate():
    torch.manual_seed(0)
    src, tgt = build_langs(PAIRS)
    for kind in ("additive", "notes"):
        model = build_model(kind, src, tgt, hidden_size=24, dropout_p=0.0)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        batch = batch_tensors(PAIRS, src, tgt)
        first = train_batch(model, batch, opt, teacher_forcing_ratio=0.5, generator=torch.Generator().manual_seed(0))
        for _ in range(40):
            last = train_batch(model, batch, opt)
        assert last < first / 10
        scores = evaluate(model, PAIRS, src, tgt)
        assert scores.exact == 1.0 and scores.bleu == pytest.approx(100.0)
        words, attn = translate(model, "Je la vois.", src, tgt)
        assert words == ["i", "see", "her", "."] and attn.shape == (5, 5)
        if kind == "additive":  # the notes' weights also cover the empty positions after EOS
            torch.testing.assert_close(attn.sum(1), torch.ones(5))
    with pytest.raises(UnknownWordError, match="'chien'"):
        translate(model, "Je vois le chien.", src, tgt)
    with pytest.raises(ValueError, match="teacher_forcing_ratio"):
        model(batch.src, batch.src_lengths, batch.tgt, teacher_forcing_ratio=1.5)
    with pytest.raises(ValueError, match="kind must be"):
        build_model("luong", src, tgt)


def test_notes_style_step_trains_one_pair():
    torch.manual_seed(0)
    src, tgt = build_langs(PAIRS)
    model = build_model("additive", src, tgt, hidden_size=16, dropout_p=0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s, t = torch.tensor(src.encode(PAIRS[0][0])), torch.tensor(tgt.encode(PAIRS[0][1]))
    losses = [train_pair_notes_style(model, s, t, opt) for _ in range(30)]
    assert losses[-1] < losses[0] / 2
