"""What building an environment spends on tokenizing its prompts: GSM8K's training prompts, chat-formatted for the
embedded SmolLM2 tokenizer, tokenized one by one (as environments did), in one batched call (a cache miss of
``grpo_rl.envs.prompt_tokens``) and read back from the cache (a hit), seconds each.

    .venv/bin/python benchmarks/micro/prompt_tokens.py
    .venv/bin/python benchmarks/micro/prompt_tokens.py --repeats 5

One thread for the tokenizer (``TOKENIZERS_PARALLELISM=false``, as the tests run it). The cache is a temporary folder,
so the run leaves nothing behind. The three ways alternate by repeat; the best repeat of each is printed, and whether
the three give the same ids. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.common, grpo_rl

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import RESULTS  # noqa: E402
from benchmarks.common.machine import announce_machine  # noqa: E402
from grpo_rl.envs import prompt_tokens  # noqa: E402
from grpo_rl.envs.data import data_dir  # noqa: E402
from grpo_rl.model.loading import load_tokenizer, resolve_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    announce_machine()
    root = data_dir()
    if root is None:
        sys.exit("no data folder: set GRPO_DATA_DIR to the folder holding gsm8k/train.jsonl")
    tokenizer = load_tokenizer(resolve_model("embedded:smollm2-135m-instruct"))
    rows = [json.loads(line) for line in (root / "gsm8k" / "train.jsonl").read_text().splitlines() if line.strip()]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}], add_generation_prompt=True, tokenize=False
        )
        for r in rows
    ]
    seconds: dict[str, list[float]] = {"one by one": [], "batched (miss)": [], "cache (hit)": []}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["GRPO_CACHE_DIR"] = cache
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            single = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
            t1 = time.perf_counter()
            for entry in Path(cache, "prompt_tokens").glob("*.npz"):
                entry.unlink()
            t2 = time.perf_counter()
            missed = prompt_tokens.tokenize_prompts(tokenizer, texts)
            t3 = time.perf_counter()
            hit = prompt_tokens.tokenize_prompts(tokenizer, texts)
            t4 = time.perf_counter()
            for name, s in zip(seconds, (t1 - t0, t3 - t2, t4 - t3), strict=True):
                seconds[name].append(s)
    print(f"{len(texts)} GSM8K training prompts; the same ids all three ways: {single == missed == hit}")
    for name, values in seconds.items():
        print(f"{name:16}{min(values):8.2f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "prompt_tokens.json").write_text(json.dumps({k: min(v) for k, v in seconds.items()}, indent=1))


if __name__ == "__main__":
    main()
