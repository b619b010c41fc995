"""Deterministic language detection with `langdetect`, as IFEval uses it.

Reference: google-research `instruction_following_eval/instructions.py`
calls `langdetect.detect(value)` in `language:response_language`,
`change_case:english_capital` and `change_case:english_lowercase`, and
counts a `LangDetectException` (e.g. text with no letters) as the
instruction being followed.

Departure: `langdetect` samples n-grams at random, and the reference leaves
its seed unset, so the same borderline text can be judged differently from one
run to the next. Here detection uses a private `DetectorFactory` seeded with
`DETECTION_SEED`, so a given text always gets the same answer. The global
`langdetect` factory (and its seed) is left untouched. Profiles are loaded
from the `langdetect` wheel; nothing is downloaded.
"""

from __future__ import annotations

import functools

from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
from langdetect.lang_detect_exception import LangDetectException

DETECTION_SEED = 0


@functools.lru_cache(maxsize=1)
def _seeded_factory() -> DetectorFactory:
    """Loads the language profiles once (about half a second)."""
    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.seed = DETECTION_SEED
    return factory


def detect_language(text: str) -> str | None:
    """The language code `langdetect.detect` reports for `text` (`"en"`, `"zh-cn"`, ...), seeded; None when it
    cannot decide (text without letters, say)."""
    detector = _seeded_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None
