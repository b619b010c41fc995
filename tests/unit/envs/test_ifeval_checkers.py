"""Hand-worked cases for each of the 25 IFEval checkers.

Every expected value is derived from the rules of the reference
(google-research `instruction_following_eval/instructions.py`), as restated in
the docstrings of `grpo_rl/envs/tasks/ifeval/instructions/checkers_*.py`; the comment beside
each case says why. Each instruction has cases that pass and cases that fail.
"""

from __future__ import annotations

import pytest

from grpo_rl.envs.tasks.ifeval.instructions import INSTRUCTION_IDS, build_checker


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _case(instruction_id: str, kwargs: dict, response: str, expected: bool, why: str):
    return pytest.param(instruction_id, kwargs, response, expected, id=f"{instruction_id}|{why}")


CASES = [
    # --- keywords:existence: case-insensitive regex *substring* search.
    _case(
        "keywords:existence",
        {"keywords": ["cat", "dog"]},
        "A Cat and a DOG.",
        True,
        "both present in other case",
    ),
    _case(
        "keywords:existence",
        {"keywords": ["cat", "dog"]},
        "Concatenate the hotdogs",
        True,
        "substrings count: con-CAT-enate, hot-DOG-s",
    ),
    _case("keywords:existence", {"keywords": ["cat", "dog"]}, "A cat alone.", False, "dog is missing"),
    # --- keywords:frequency: non-overlapping substring matches, any case.
    _case(
        "keywords:frequency",
        {"keyword": "the", "frequency": 3, "relation": "at least"},
        "The theory of the thing.",
        True,
        "The + THEory + the = 3 >= 3 (thing has no 'the')",
    ),
    _case(
        "keywords:frequency",
        {"keyword": "the", "frequency": 3, "relation": "less than"},
        "The theory of the thing.",
        False,
        "3 is not < 3",
    ),
    _case(
        "keywords:frequency",
        {"keyword": "the", "frequency": 3, "relation": "less than"},
        "The theory of a thing.",
        True,
        "The + THEory = 2 < 3",
    ),
    _case(
        "keywords:frequency",
        {"keyword": "the", "frequency": 3, "relation": "at least"},
        "The theory of a thing.",
        False,
        "2 is not >= 3",
    ),
    _case(
        "keywords:frequency",
        {"keyword": " cat ", "frequency": 1, "relation": "at least"},
        "a cat",
        True,
        "keyword is stripped to 'cat' before matching",
    ),
    # --- keywords:forbidden_words: whole words (\b...\b), any case.
    _case(
        "keywords:forbidden_words",
        {"forbidden_words": ["cat"]},
        "I like cats.",
        True,
        "'cats' is not the whole word 'cat'",
    ),
    _case(
        "keywords:forbidden_words",
        {"forbidden_words": ["cat"]},
        "Concatenate.",
        True,
        "substring inside a word is allowed",
    ),
    _case(
        "keywords:forbidden_words",
        {"forbidden_words": ["cat"]},
        "CAT!",
        False,
        "whole word, case-insensitive",
    ),
    _case(
        "keywords:forbidden_words",
        {"forbidden_words": ["cat", "dog"]},
        "a hot-dog",
        False,
        "'-' is a word boundary, so 'dog' is a whole word",
    ),
    # --- keywords:letter_frequency: one character of the lower-cased response.
    _case(
        "keywords:letter_frequency",
        {"letter": "a", "let_frequency": 3, "let_relation": "at least"},
        "Banana",
        True,
        "b-A-n-A-n-A: 3 >= 3",
    ),
    _case(
        "keywords:letter_frequency",
        {"letter": "a", "let_frequency": 3, "let_relation": "less than"},
        "Banana",
        False,
        "3 is not < 3",
    ),
    _case(
        "keywords:letter_frequency",
        {"letter": "A", "let_frequency": 3, "let_relation": "at least"},
        "aAA",
        True,
        "letter and text are lower-cased: 3 a's >= 3",
    ),
    _case(
        "keywords:letter_frequency",
        {"letter": "A", "let_frequency": 3, "let_relation": "less than"},
        "aAA",
        False,
        "3 is not < 3",
    ),
    _case(
        "keywords:letter_frequency",
        {"letter": "#", "let_frequency": 3, "let_relation": "at least"},
        "#a #b #c",
        True,
        "departs from the reference (a random letter): the symbol asked for is counted, 3 '#'",
    ),
    _case(
        "keywords:letter_frequency",
        {"letter": "#", "let_frequency": 3, "let_relation": "at least"},
        "#a #b",
        False,
        "2 '#' < 3",
    ),
    # --- punctuation:no_comma: the ASCII comma only.
    _case("punctuation:no_comma", {}, "No commas here.", True, "no comma"),
    _case("punctuation:no_comma", {}, "One, two", False, "one ASCII comma"),
    _case("punctuation:no_comma", {}, "Fullwidth\uff0ccomma", True, "U+FF0C is not ','"),
    # --- language:response_language: seeded langdetect; undecidable counts as followed.
    _case(
        "language:response_language",
        {"language": "fr"},
        "Bonjour, je suis très content de vous voir aujourd'hui.",
        True,
        "plain French",
    ),
    _case(
        "language:response_language",
        {"language": "fr"},
        "The weather is lovely today and I am going for a walk.",
        False,
        "plain English",
    ),
    _case(
        "language:response_language",
        {"language": "fr"},
        "12345 !!!",
        True,
        "no letters: langdetect raises, which the reference counts as followed",
    ),
    # --- length_constraints:number_sentences: NLTK English Punkt sentences.
    _case(
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "at least"},
        "Mr. Smith went home. He slept. Then he woke up.",
        True,
        "'Mr.' is a Punkt abbreviation, so 3 sentences >= 3",
    ),
    _case(
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "Mr. Smith went home. He slept. Then he woke up.",
        False,
        "3 is not < 3",
    ),
    _case(
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "Dr. Jones arrived. He sat.",
        True,
        "'Dr.' is an abbreviation: 2 < 3",
    ),
    _case(
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "at least"},
        "Dr. Jones arrived. He sat.",
        False,
        "2 is not >= 3",
    ),
    # --- length_constraints:number_words: \w+ runs.
    _case(
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "Hello, world! Don't go.",
        True,
        "Hello, world, Don, t, go = 5 >= 5",
    ),
    _case(
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "Hello, world! Don't go.",
        False,
        "5 is not < 5",
    ),
    _case(
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "Hi there, you all!",
        True,
        "4 words < 5",
    ),
    _case(
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "Hi there, you all!",
        False,
        "4 is not >= 5",
    ),
    # --- length_constraints:number_paragraphs: exact count of '***'-separated pieces.
    _case(
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "A\n***\nB\n***\nC",
        True,
        "three pieces",
    ),
    _case(
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "***\nA\n***\nB\n***\nC\n***",
        True,
        "blank first and last pieces are not counted",
    ),
    _case(
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "A\n***\n***\nB\n***\nC",
        False,
        "blank piece between two dividers fails outright",
    ),
    _case(
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "A\n\nB\n\nC",
        False,
        "blank lines do not separate here: 1 paragraph",
    ),
    _case(
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "A *** B *** C *** D",
        False,
        "4 paragraphs, and the count must be exact",
    ),
    # --- length_constraints:nth_paragraph_first_word: '\n\n' paragraphs.
    _case(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "summary"},
        'Intro text.\n\n"Summary, here.\n\nEnd.',
        True,
        "3 paragraphs; '\"Summary,' loses the quote, is cut at ',' and lower-cased",
    ),
    _case(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "summary"},
        "Intro.\n\nSummaries are good.\n\nEnd.",
        False,
        "'summaries' != 'summary'",
    ),
    _case(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "summary"},
        "Intro.\n\nSummary here.\n\nMore.\n\nEnd.",
        False,
        "right word but 4 paragraphs",
    ),
    _case(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "summary"},
        "Intro.\n\n'Summary: yes.\n\nEnd.",
        False,
        "':' is not a stop character, so the word is 'summary:'",
    ),
    _case(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "summary"},
        "\n\nSummary first.\n\nSecond.\n\nThird.",
        False,
        "3 non-blank paragraphs, but the 1st piece of the raw split is blank",
    ),
    _case(
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "summary"},
        "Summary first.\n\nSecond.\n\nThird.",
        True,
        "same text without the leading blank piece",
    ),
    # --- detectable_content:number_placeholders: single-line [...], at least N.
    _case(
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], see you at [address].",
        True,
        "2 placeholders",
    ),
    _case(
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name].",
        False,
        "1 placeholder",
    ),
    _case(
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "[a\nb] and [c]",
        False,
        "a bracket pair cannot span a newline: 1",
    ),
    _case(
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "[] []",
        True,
        "empty brackets count",
    ),
    # --- detectable_content:postscript: marker anywhere, case-insensitive, loose spacing.
    _case(
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Body.\nP.S. See you.",
        True,
        "plain P.S.",
    ),
    _case(
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Body.\np. s. lowercase",
        True,
        "lower case and one space between parts",
    ),
    _case(
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Thanks! P.S. call me",
        True,
        "not anchored to a line start",
    ),
    _case(
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Body.\nPS: no dots",
        False,
        "the dots are required",
    ),
    _case(
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Body.\nP.P.S more",
        True,
        "P.P.S",
    ),
    _case(
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Body.\nP.S. only",
        False,
        "P.S. is not P.P.S",
    ),
    # --- detectable_format:number_bullet_lists: exact count of '* x' / '- x' lines.
    _case(
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "* one\n* two",
        True,
        "2 star bullets",
    ),
    _case(
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "- one\n- two\n- three",
        False,
        "3 bullets, count must be exact",
    ),
    _case(
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "* one\n**bold** line\n- two",
        True,
        "a line starting '**' is not a bullet",
    ),
    _case(
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "---\n* one",
        True,
        "a '---' rule counts as a dash bullet",
    ),
    # --- detectable_format:constrained_response: one of three exact sentences.
    _case("detectable_format:constrained_response", {}, "My answer is yes.", True, "exact option"),
    _case(
        "detectable_format:constrained_response",
        {},
        "Well. My answer is maybe. Because.",
        True,
        "option anywhere in the text",
    ),
    _case("detectable_format:constrained_response", {}, "My answer is Yes.", False, "case-sensitive"),
    _case(
        "detectable_format:constrained_response",
        {},
        "My answer is no",
        False,
        "the final dot is part of the option",
    ),
    # --- detectable_format:number_highlighted_sections: *x* or **x**, at least N.
    _case(
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*one* and *two*",
        True,
        "2 single highlights",
    ),
    _case(
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*one* and **two**",
        True,
        "1 single + 1 bold",
    ),
    _case(
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "**bold** only",
        False,
        "a bold phrase counts once; its inner '**' pairs are empty",
    ),
    _case(
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 1},
        "* * and *one\ntwo*",
        False,
        "whitespace-only and multi-line pairs do not count",
    ),
    # --- detectable_format:multiple_sections: case-sensitive splitter + number, at least N.
    _case(
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\nIntro\nSECTION 2\nBody",
        True,
        "2 headers",
    ),
    _case(
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION1 a SECTION2 b",
        True,
        "the space before the number is optional",
    ),
    _case(
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "Section 1\nIntro\nSection 2\nBody",
        False,
        "splitter is case-sensitive: 0",
    ),
    _case(
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION A\nIntro\nSECTION B\nBody",
        False,
        "a number must follow: 0",
    ),
    _case(
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 3},
        "Section 1\nIntro\nSection 2\nBody",
        False,
        "2 < 3",
    ),
    # --- detectable_format:json_format: one optional ``` fence, then json.loads.
    _case("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True, "json fence"),
    _case("detectable_format:json_format", {}, '```JSON\n{"a": [1, 2]}\n```', True, "JSON fence"),
    _case("detectable_format:json_format", {}, '{"a": 1} trailing', False, "extra text"),
    _case(
        "detectable_format:json_format",
        {},
        '```python\n{"a": 1}\n```',
        False,
        "only '```' is removed, leaving 'python' in front",
    ),
    _case(
        "detectable_format:json_format",
        {},
        '"just a string"',
        True,
        "a bare JSON string is valid JSON",
    ),
    # --- detectable_format:title: <<...>> on one line, not blank.
    _case("detectable_format:title", {}, "<<My Title>>\nText", True, "a title"),
    _case("detectable_format:title", {}, "<< >>\nText", False, "blank title"),
    _case("detectable_format:title", {}, "<<My\nTitle>>", False, "title cannot span lines"),
    _case("detectable_format:title", {}, "<My Title>", False, "single brackets"),
    # --- combination:two_responses: exactly two different non-blank pieces around '******'.
    _case("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", True, "two answers"),
    _case("combination:two_responses", {}, "Same.\n******\nSame.", False, "identical answers"),
    _case(
        "combination:two_responses",
        {},
        "A\n******\n******\nB",
        False,
        "blank piece between separators",
    ),
    _case(
        "combination:two_responses",
        {},
        "******\nA\n******\nB\n******",
        True,
        "blank pieces at the ends are ignored",
    ),
    _case("combination:two_responses", {}, "A ****** B ****** C", False, "three answers"),
    # --- combination:repeat_prompt: starts with the prompt, case-insensitive.
    _case(
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about cats."},
        "write a poem about CATS. Roses are red.",
        True,
        "case is ignored",
    ),
    _case(
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about cats."},
        "  Write a poem about cats.\nRoses are red.",
        True,
        "leading whitespace is stripped",
    ),
    _case(
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about cats."},
        "Sure! Write a poem about cats. Roses.",
        False,
        "something before the prompt",
    ),
    # --- startend:end_checker: ends with the phrase, case-insensitive, outer quotes dropped.
    _case(
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Text. Any other questions?",
        True,
        "exact ending",
    ),
    _case(
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        '"Text. any other QUESTIONS?"  ',
        True,
        "whitespace, then quotes, stripped; any case",
    ),
    _case(
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Any other questions? Thanks.",
        False,
        "words after the phrase",
    ),
    _case(
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Text. Any other questions",
        False,
        "the '?' is part of the phrase",
    ),
    # --- startend:quotation: ASCII double quotes around the stripped response.
    _case("startend:quotation", {}, '"Hello"', True, "wrapped"),
    _case("startend:quotation", {}, '  "Hi"\n', True, "outer whitespace stripped first"),
    _case("startend:quotation", {}, '"', False, "one character is too short"),
    _case("startend:quotation", {}, "\u201cHi\u201d", False, "curly quotes do not count"),
    _case("startend:quotation", {}, '"Hi" there', False, "does not end with a quote"),
    # --- change_case:capital_word_frequency: nltk.word_tokenize tokens that are isupper().
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 3, "capital_relation": "at least"},
        "NASA and the U.S. ARE here",
        True,
        "NASA, U.S., ARE: 3 >= 3",
    ),
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 3, "capital_relation": "less than"},
        "NASA and the U.S. ARE here",
        False,
        "3 is not < 3",
    ),
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 3, "capital_relation": "at least"},
        "I am OK. Don't STOP",
        True,
        "I, OK, STOP: 3 >= 3",
    ),
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "DON'T stop",
        True,
        "the contraction splits into DO + N'T, both upper case: 2",
    ),
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "Don't STOP",
        False,
        "Do + n't + STOP: only STOP is upper case, 1 < 2",
    ),
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "COVID-19 IS-BAD",
        True,
        "hyphenated tokens stay whole and are upper case: 2",
    ),
    _case(
        "change_case:capital_word_frequency",
        {"capital_frequency": 3, "capital_relation": "at least"},
        "COVID-19 IS-BAD",
        False,
        "2 < 3",
    ),
    # --- change_case:english_capital: isupper() and detected as English.
    _case(
        "change_case:english_capital",
        {},
        "THIS IS AN ENGLISH SENTENCE ABOUT THE WEATHER TODAY.",
        True,
        "upper-case English",
    ),
    _case(
        "change_case:english_capital",
        {},
        "This is mostly uppercase TEXT.",
        False,
        "lower-case letters present",
    ),
    _case(
        "change_case:english_capital",
        {},
        "Я ОЧЕНЬ РАД ВИДЕТЬ ВАС СЕГОДНЯ, ПОГОДА ХОРОШАЯ.",
        False,
        "upper case, but Russian",
    ),
    _case(
        "change_case:english_capital",
        {},
        "12345 !!!",
        False,
        "no cased character, so isupper() is False before language is asked",
    ),
    # --- change_case:english_lowercase: islower() and detected as English.
    _case(
        "change_case:english_lowercase",
        {},
        "this is an english sentence about the weather today.",
        True,
        "lower-case English",
    ),
    _case("change_case:english_lowercase", {}, "this is English.", False, "one capital"),
    _case(
        "change_case:english_lowercase",
        {},
        "c'est une phrase en français sur le temps qu'il fait aujourd'hui.",
        False,
        "lower case, but French",
    ),
]


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "expected"), CASES)
def test_checker_follows_reference_rules(instruction_id: str, kwargs: dict, response: str, expected: bool) -> None:
    assert build_checker(instruction_id, kwargs)(response) is expected


def test_every_instruction_id_has_a_passing_and_a_failing_case() -> None:
    outcomes: dict[str, set[bool]] = {}
    for case in CASES:
        instruction_id, _, _, expected = case.values
        outcomes.setdefault(instruction_id, set()).add(expected)
    assert set(outcomes) == set(INSTRUCTION_IDS)
    assert all(seen == {True, False} for seen in outcomes.values())
