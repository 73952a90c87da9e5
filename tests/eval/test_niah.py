"""Needle in a haystack: the contexts, the weights, the scores against greedy decoding, and the CLI."""

import json

import pytest
from output_asserts import assert_png

from linlm import create_model
from linlm.errors import ConfigError, DataError
from linlm.eval.niah import (NEEDLES, QUESTION, NIAHConfig, build_haystack, cell_weights, niah_requests,
                             parse_grid, run_niah)

HAY = ["The rain had stopped and the grass was wet. She walked out into the garden and looked at the trees. " * 3,
       "He counted the coins twice. There were ten of them, all silver, and he put them back in the box. " * 3] * 4


def test_contexts_have_the_grid_length_and_the_needle_at_its_depth(tokenizer):
    cfg = NIAHConfig(lengths=[120, 200], depths=[0, 50, 100], mode="easy", trials=2).validate()
    hay = build_haystack(tokenizer, HAY, 200)
    reqs = niah_requests(tokenizer, hay, cfg, cfg.lengths)
    assert len(reqs) == 2 * 3 * 2
    question = tokenizer.encode("\n\n" + QUESTION)
    for i, j, t, req in reqs:
        L = cfg.lengths[i]
        assert len(req.context) == L and req.context[-len(question):] == question
        number = tokenizer.decode(req.continuations[0]).strip()
        needle = tokenizer.encode(" " + NEEDLES["easy"].format(n=number) + " ")
        n_hay = L - len(needle) - len(question)
        at = round(n_hay * cfg.depths[j] / 100)
        assert req.context[at:at + len(needle)] == needle
        assert req.context[:at] == hay[:at]
    with pytest.raises(DataError, match="fewer than"):
        build_haystack(tokenizer, HAY[:1], 10_000)


def test_weights_and_grid_parsing():
    cfg = NIAHConfig(lengths=[100, 200, 400], depths=[0, 50, 100], length_ratio=4, depth_ratio=2).validate()
    w = cell_weights(cfg)
    assert w[0][0] == 1 and w[0][2] == pytest.approx(4) and w[2][0] == pytest.approx(2) and w[2][2] == pytest.approx(8)
    assert w[1][1] == pytest.approx(2 * 2 ** 0.5)
    assert parse_grid("1000:16000:5:geometric", "lengths") == [1000, 2000, 4000, 8000, 16000]
    assert parse_grid("1000:16000:6", "lengths") == [1000, 4000, 7000, 10000, 13000, 16000]
    assert parse_grid("1000:16000:6:linear", "lengths") == parse_grid("1000:16000:6", "lengths")
    assert parse_grid("0:100:3", "depths") == [0, 50, 100]
    # The paper's grid: linspace(1000, 16000, 35) rounded, by 35 depths from 0 to 100 %.
    lengths = NIAHConfig().validate().lengths
    assert len(lengths) == 35 and len(NIAHConfig().depths) == 35
    assert lengths[0] == 1000 and lengths[-1] == 16000 and lengths[1] == round(1000 + 15000 / 34)
    assert max(b - a for a, b in zip(lengths, lengths[1:])) - min(b - a for a, b in zip(lengths, lengths[1:])) <= 1
    with pytest.raises(ConfigError, match="LO:HI:N"):
        parse_grid("0:100:3:geometric", "depths")
    with pytest.raises(ConfigError, match="LO:HI:N"):
        parse_grid("1000:16000:5:cubic", "lengths")
    with pytest.raises(ConfigError, match="mode"):
        NIAHConfig(mode="hard").validate()
    with pytest.raises(ConfigError, match="LO:HI:N"):
        parse_grid("a,b", "lengths")


def test_scores_equal_greedy_decoding_and_long_lengths_are_skipped(tokenizer):
    from linlm.models.generation import generate_ids

    model = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=300).eval()
    cfg = NIAHConfig(lengths=[120, 250, 400], depths=[0, 100], trials=2, mode="standard")
    res = run_niah(model, tokenizer, HAY, cfg, batch_size=3)
    assert res["lengths"] == [120, 250] and res["skipped_lengths"] == [400]
    hay = build_haystack(tokenizer, HAY, 250)
    hits = {}
    for i, j, t, req in niah_requests(tokenizer, hay, NIAHConfig(**{**cfg.__dict__, "lengths": [120, 250]}).validate(),
                                      [120, 250]):
        answer = req.continuations[0]
        out = generate_ids(model, req.context, len(answer), temperature=0.0, top_k=0, stop_at_eos=False)
        hits[(j, i)] = hits.get((j, i), 0) + int(out == answer)
    assert res["accuracy"] == [[hits[(j, i)] / 2 for i in range(2)] for j in range(2)]
    w = cell_weights(NIAHConfig(lengths=[120, 250], depths=[0, 100]).validate())
    acc = res["accuracy"]
    expect = sum(w[j][i] * acc[j][i] for j in range(2) for i in range(2)) / sum(map(sum, w))
    assert res["weighted"] == pytest.approx(expect)
    # The penalty: the skipped length 400 counts as a miss over the whole requested grid.
    w3 = cell_weights(NIAHConfig(lengths=[120, 250, 400], depths=[0, 100]).validate())
    assert res["score"] == pytest.approx(sum(w3[j][i] * acc[j][i] for j in range(2) for i in range(2))
                                         / sum(map(sum, w3)))
    assert res["cumulative"] == pytest.approx([(acc[0][0] + acc[1][0]) / 2, sum(map(sum, acc)) / 4])


def test_scores_of_a_known_grid():
    """Accumulated accuracy, weighted average and the penalised score on a hand-made grid."""
    from linlm.eval.niah_scores import (accuracy_at_bounds, cumulative_accuracy, penalized_score, summary_bounds,
                                        weighted_average)

    acc = [[1.0, 0.0, 1.0],   # depth 0 %
           [1.0, 1.0, 0.0]]   # depth 100 %
    assert cumulative_accuracy(acc) == pytest.approx([1.0, 0.75, 4 / 6])
    w = [[1.0, 2.0, 4.0], [2.0, 4.0, 8.0]]
    assert weighted_average(acc, w) == pytest.approx((1 + 4 + 2 + 4) / 21)
    # Nothing skipped: the score is the weighted average; a skipped longest length costs its weight.
    assert penalized_score(acc, [1, 2, 3], [1, 2, 3], [0, 100], 4.0, 2.0) == pytest.approx(weighted_average(acc, w))
    two = [row[:2] for row in acc]
    assert penalized_score(two, [1, 2], [1, 2, 3], [0, 100], 4.0, 2.0) == pytest.approx((1 + 2 + 4) / 21)
    assert summary_bounds([1000, 4000, 7000, 10000, 13000, 16000]) == [4000, 7000, 10000, 16000]
    res = {"lengths": [1000, 2000, 4000], "cumulative": [0.5, 0.25, 0.1]}
    assert accuracy_at_bounds(res, 2) == {2000: 0.25, 4000: 0.1}


def test_niah_cli(model_dir, tmp_path):
    from linlm.cli import main

    hay = tmp_path / "hay.txt"
    hay.write_text("\n\n".join(HAY))
    out, png = tmp_path / "niah.json", tmp_path / "niah.png"
    assert main(["niah", "--model", str(model_dir), "--haystack", str(hay), "--lengths", "120,200", "--depths", "0:100:3",
                 "--mode", "easy", "--json", str(out), "--plot", str(png)]) == 0
    res = json.loads(out.read_text())
    assert res["lengths"] == [120, 200] and len(res["accuracy"]) == 3 and 0 <= res["weighted"] <= 1
    assert res["score"] == pytest.approx(res["weighted"]) and len(res["cumulative"]) == 2
    assert_png(png, (600, 480))  # 5 x 4 inches at 120 dpi, drawn
    # A second run replaces linlm's own files (a user's file there is refused: tests/eval/test_eval_cli.py).
    assert main(["niah", "--model", str(model_dir), "--haystack", str(hay), "--lengths", "120", "--depths", "50",
                 "--json", str(out), "--plot", str(png)]) == 0
    assert json.loads(out.read_text())["lengths"] == [120]


def test_niah_cli_takes_the_choice_scoring_settings(model_dir, tmp_path, capsys):
    from linlm.cli import main

    hay = tmp_path / "hay.txt"
    hay.write_text("\n\n".join(HAY))
    out = tmp_path / "niah.json"
    assert main(["niah", "--model", str(model_dir), "--haystack", str(hay), "--lengths", "120", "--depths", "0,100",
                 "--mode", "easy", "--scoring", "choice", "--candidates", "5", "--alphabet", "letters",
                 "--value-length", "1", "--trials", "2", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["chance"] == pytest.approx(1 / 5) and res["items"] == 4
    assert "(chance 0.2000)" in capsys.readouterr().out
    assert main(["niah", "--model", str(model_dir), "--haystack", str(hay), "--candidates", "1",
                 "--scoring", "choice"]) == 2


def test_a_length_at_the_window_leaves_no_room_for_the_answer_and_is_skipped(tokenizer):
    """Context length == max_seq_len: the answer's tokens would run past the window, so that length is skipped
    (with the others kept) instead of failing the whole grid."""
    model = create_model("llama", preset="tiny", vocab_size=320, max_seq_len=250).eval()
    res = run_niah(model, tokenizer, HAY, NIAHConfig(lengths=[120, 250], depths=[0], trials=1), batch_size=2)
    assert res["lengths"] == [120] and res["skipped_lengths"] == [250]
    with pytest.raises(ConfigError, match="no room for the answer"):
        run_niah(model, tokenizer, HAY, NIAHConfig(lengths=[250], depths=[0], trials=1))


def test_a_length_too_short_for_the_needle_and_question_is_skipped(tokenizer):
    """With a fine tokenizer the needle and the question alone can fill a short context: that length is skipped and
    reported (the others kept), and only a grid of such lengths alone is an error."""
    model = create_model("tnl", preset="tiny", vocab_size=320).eval()
    res = run_niah(model, tokenizer, HAY, NIAHConfig(lengths=[20, 120], depths=[0, 100], trials=1), batch_size=2)
    assert res["lengths"] == [120] and res["skipped_lengths"] == [20] and len(res["accuracy"][0]) == 1
    with pytest.raises(ConfigError, match="every context length is too short for the needle and the question"):
        run_niah(model, tokenizer, HAY, NIAHConfig(lengths=[20], depths=[0], trials=1))


def test_the_heatmap_is_a_figure_of_its_own(tmp_path):
    """A matplotlib Figure (no pyplot; tests/scaling checks that no plot touches pyplot), drawn into a PNG."""
    from matplotlib.figure import Figure

    from linlm.eval.niah import heatmap_figure, plot_heatmap

    res = {"mode": "easy", "lengths": [100, 200, 400], "depths": [0.0, 50.0, 100.0], "mean": 0.5, "weighted": 0.6,
           "score": 0.6,
           "accuracy": [[1, 0, 1], [0, 1, 0], [1, 1, 0]]}
    assert isinstance(heatmap_figure(res), Figure)
    assert_png(plot_heatmap(res, tmp_path / "h.png"), (600, 480))


# ---- choice scoring: stand-in scorers whose behaviour is known ------------------------------------------------------


def copier_scores(vocab: int, confidence: float = 0.9):
    """A stand-in for score_requests: an induction copier over token ids. At each position it predicts, with
    probability ``confidence``, the token that followed the latest earlier occurrence of the longest suffix of the
    sequence so far (the rest spread evenly over the other tokens); without an earlier match, every token alike."""
    import math

    from linlm.eval.scoring import Scored

    def predicted(seq):
        for k in range(len(seq) - 1, 0, -1):  # longest suffix first
            suffix = seq[-k:]
            for start in range(len(seq) - k - 1, -1, -1):  # latest earlier occurrence first
                if seq[start:start + k] == suffix:
                    return seq[start + k]
        return None

    def score(model, requests, **kwargs):
        out = []
        for r in requests:
            logliks = []
            for cont in r.continuations:
                seq, ll = list(r.context), 0.0
                for t in cont:
                    guess = predicted(seq)
                    p = 1.0 / vocab if guess is None else (confidence if t == guess else (1 - confidence) / (vocab - 1))
                    ll += math.log(p)
                    seq.append(t)
                logliks.append(ll)
            out.append(Scored(logliks, [False] * len(logliks)))
        return out

    return score


class _NoLimit:
    """What run_niah asks of a model besides the scorer: its window (none) and its config's arch."""

    class config:
        arch = "stand-in"
        max_seq_len = None


def test_choice_scoring_tells_a_copier_from_a_guesser(tokenizer, monkeypatch):
    """One-digit needles: a model that copies what followed the question's earlier occurrence finds every needle
    of the easy mode (accuracy 1, above chance); the same copier in standard mode, where the question never
    occurred before, and a model that scores every number alike both sit at chance (1 / candidates) and are said
    to be."""
    import linlm.eval.niah as niah
    from linlm.eval.scoring import Scored

    monkeypatch.setattr(niah, "model_max_length", lambda model: None)
    cfg = dict(lengths=[120, 200], depths=[0, 50, 100], trials=4, scoring="choice", candidates=4, value_length=1)
    monkeypatch.setattr(niah, "score_requests", copier_scores(tokenizer.vocab_size))
    easy = run_niah(_NoLimit(), tokenizer, HAY, NIAHConfig(mode="easy", **cfg))
    assert easy["chance"] == 0.25 and easy["items"] == 2 * 3 * 4
    assert easy["mean"] == 1.0 and easy["above_chance"]
    assert easy["chance_band"] == pytest.approx(0.25 + 2 * (0.25 * 0.75 / 24) ** 0.5)
    standard = run_niah(_NoLimit(), tokenizer, HAY, NIAHConfig(mode="standard", **cfg))
    assert standard["mean"] == pytest.approx(0.25) and not standard["above_chance"]
    monkeypatch.setattr(niah, "score_requests", lambda model, reqs, **kw: [Scored([-1.0] * len(r.continuations),
                                                                                  [False] * len(r.continuations))
                                                                           for r in reqs])
    alike = run_niah(_NoLimit(), tokenizer, HAY, NIAHConfig(mode="easy", **cfg))
    assert alike["mean"] == pytest.approx(0.25) and not alike["above_chance"]  # a four-way tie earns 1/4


def test_choice_requests_rank_the_true_number_among_distinct_others(tokenizer):
    cfg = NIAHConfig(lengths=[120], depths=[0, 100], trials=3, mode="easy", scoring="choice", candidates=5,
                     value_length=2).validate()
    hay = build_haystack(tokenizer, HAY, 120)
    for _, j, _, req in niah_requests(tokenizer, hay, cfg, cfg.lengths):
        numbers = [tokenizer.decode(c).strip() for c in req.continuations]
        assert len(numbers) == 5 == len(set(numbers)) and all(len(n) == 2 and n.isdigit() for n in numbers)
        if cfg.depths[j] == 0:  # the needle opens the context, and it holds the first (true) number
            needle = tokenizer.encode(" " + NEEDLES["easy"].format(n=numbers[0]) + " ")
            assert req.context[:len(needle)] == needle
    # The greedy scoring's chance is a guess of the number; bad settings are refused.
    from linlm.eval.niah import chance_level

    assert chance_level(NIAHConfig(value_length=3).validate()) == pytest.approx(1 / 900)
    for bad in ({"scoring": "vote"}, {"candidates": 1, "scoring": "choice"}, {"value_length": 0},
                {"alphabet": "runes"}):
        with pytest.raises(ConfigError):
            NIAHConfig(**bad).validate()
