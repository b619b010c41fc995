"""docs/migrating.md names only keys that exist: every ``python sota/grpo.py ...`` and ``python sota/grpo-async.py ...``
line composes against the schema and passes the checks a run makes before it starts (nothing is run), and every
key in the tables' "here" column is a schema key."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from grpo_rl.api import compose
from grpo_rl.cli.entry import schema_keys
from grpo_rl.run.preflight import validate

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "migrating.md"
SCRIPTS = {"sota/grpo.py": "sync", "sota/grpo-async.py": "async"}


def command_lines(text: str) -> list[str]:
    """Every ``python sota/...`` command of ``text``: in ```bash blocks (continued lines joined, comments dropped)
    and in inline code."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if "python sota/" in line:
                commands.append(line[line.index("python sota/") :])
    commands += re.findall(r"`(python sota/[^`]*)`", text)
    return commands


def parse(command: str) -> tuple[str, str | None, list[str]]:
    """``(mode, config name, overrides)`` of one command line."""
    words = shlex.split(command)
    assert words[0] == "python" and words[1] in SCRIPTS, command
    config, overrides, rest = None, [], iter(words[2:])
    for word in rest:
        if word == "--config-name":
            config = next(rest)
        elif word.startswith("--config-name="):
            config = word.split("=", 1)[1]
        elif word.startswith("-"):
            raise AssertionError(f"{command}: {word} is not handled by this test")
        else:
            overrides.append(word)
    return SCRIPTS[words[1]], config, overrides


COMMANDS = command_lines(DOC.read_text())


def test_the_doc_has_a_command_per_framework():
    assert len(COMMANDS) >= 4, COMMANDS
    assert any(c.startswith("python sota/grpo-async.py") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c.split())[12:72] for c in COMMANDS])
def test_each_command_composes_and_passes_the_checks(command, monkeypatch):
    mode, config, overrides = parse(command)
    monkeypatch.chdir(ROOT)  # the doc's reward files are relative to the repository
    cfg = compose(config, overrides)  # an unknown key or a value of the wrong type raises ConfigError
    validate(cfg, mode=mode)  # what make_run checks before any device, model or engine


def here_keys(text: str) -> list[str]:
    """The keys named in the second column ("here") of the doc's tables: each backticked word's part before ``=``
    that looks like a dotted key (script names and other values are skipped)."""
    keys = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 3 or cells[1] in ("here", "---"):
            continue
        for span in re.findall(r"`([^`]*)`", cells[1]):
            for word in span.split():
                key = word.lstrip("+").split("=")[0]
                if re.fullmatch(r"[a-z_]+(\.[a-z0-9_]+)*", key):
                    keys.append(key)
    return keys


def test_every_key_in_the_tables_exists():
    keys, open_keys, _ = schema_keys()
    named = here_keys(DOC.read_text())
    assert len(named) > 100, len(named)
    unknown = [k for k in named if k not in keys and not any(k.startswith(f"{o}.") for o in open_keys)]
    assert not unknown, unknown


def test_an_unknown_key_would_fail():
    """The checks above can fail: a command or a table naming a key the schema lacks."""
    from grpo_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.kl_coeff"):
        compose(None, ["policy.kl_coeff=0.1"])
    assert here_keys("| a | here | b |\n| --- | --- | --- |\n| x | `policy.kl_coeff=0.1` `sota/grpo.py` | y |") == [
        "policy.kl_coeff"
    ]
