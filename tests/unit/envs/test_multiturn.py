"""Multi-turn tool use: the tool message rendered once by the chat template, the turn loop, the batch's masks, and
token exactness: every model token the learner trains on is an id the engine sampled, with the engine's log-prob,
in the context the engine sampled it from."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from grpo_rl.algo.loss import LossSettings, grpo_loss
from grpo_rl.engines.base import SamplingSpec, pack_rollouts
from grpo_rl.envs.multiturn import ERROR_KINDS, ToolMessages, ToolUse, pack_episodes, run_episodes, tool_metrics
from grpo_rl.envs.tools.configured import configured_tools
from grpo_rl.envs.tools.registry import BUILTIN_TOOLS, call_tool
from grpo_rl.rollout.collector import Collector
from grpo_rl.training.learner import loss_mask
from tests.unit.helpers import file_env, write_jsonl

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
BAD_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*"}}</tool_call>'


class ScriptedEngine:
    """Answers each context with the next scripted text (tokenised with the real tokenizer, some tokens merged
    across the tool call's end so that a re-tokenisation could not reproduce them), with random log-probs; records
    every context it was given and every answer it sampled."""

    def __init__(self, tokenizer, script: list[str], eos: bool = True):
        self.tokenizer = tokenizer
        self.script = list(script)
        self.calls: list[dict] = []
        self.gen = torch.Generator().manual_seed(0)
        self.eos = eos
        self.pad_id = tokenizer.pad_token_id

    def generate(self, prompts, n, sampling: SamplingSpec):
        responses, logprobs, truncated = [], [], []
        for p in prompts:
            for _ in range(n):
                text = self.script.pop(0)
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if not text.endswith("</tool_call>") and self.eos:
                    ids.append(self.tokenizer.eos_token_id)
                lps = (-torch.rand(len(ids), generator=self.gen) * 3).tolist()
                self.calls.append({"context": list(p), "ids": ids, "logprobs": lps, "stop": sampling.stop})
                responses.append(ids)
                logprobs.append(lps)
                truncated.append(False)
        return pack_rollouts(prompts, responses, logprobs, truncated, n, self.pad_id)


def decode(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def test_tool_messages_close_the_turn_and_open_the_next(tokenizer):
    ids = ToolMessages(tokenizer).render("42")
    assert tokenizer.decode(ids) == "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def test_episodes_are_token_exact(tokenizer):
    prompts = [
        tokenizer.encode("<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"),
        tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ]
    # Prompt 0: a call, then the answer; prompt 1: an answer at once, then a malformed call and an answer.
    # Turn 1 of the 4 episodes (2 per prompt), then turn 2 of the two that called the calculator.
    engine = ScriptedEngine(
        tokenizer, [f"Let me compute. {CALL}", "Hello!", BAD_CALL, "Bye.", "The answer is 42.", "#### 1"]
    )
    tools = ToolUse(dict(BUILTIN_TOOLS))
    messages = ToolMessages(tokenizer)
    episodes = run_episodes(
        engine,
        prompts,
        2,
        SamplingSpec(max_new_tokens=64, seed=3),
        tools=tools,
        messages=messages,
        decode=decode(tokenizer),
        max_turns=3,
        max_total_tokens=4096,
    )
    assert [e.turns for e in episodes] == [2, 1, 2, 1]
    assert [e.tool_calls for e in episodes] == [1, 0, 1, 0]
    assert episodes[2].tool_errors == {"syntax": 1}
    assert all("</tool_call>" in c["stop"] for c in engine.calls)  # every turn stops at a call's end

    batch = pack_episodes(prompts, episodes, 2, pad_id=tokenizer.pad_token_id)
    # Every model token of every row is an engine sample, in order, with the engine's log-prob, and every turn
    # after the first was sampled from exactly the ids before it in the row.
    turns_of = {0: [0, 4], 1: [1], 2: [2, 5], 3: [3]}  # engine call index per episode and turn
    replies = {0: "42", 2: call_tool(BUILTIN_TOOLS["calculator"], {"expression": "6*"})[0]}
    for row, calls in turns_of.items():
        n = int(batch["response_mask"][row].sum())
        ids = batch["response_ids"][row, :n].tolist()
        model = batch["loss_mask"][row, :n].bool().tolist()
        lps = batch["behavior_logprobs"][row, :n].tolist()
        prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
        model_ids = [t for t, m in zip(ids, model, strict=True) if m]
        model_lps = [x for x, m in zip(lps, model, strict=True) if m]
        assert model_ids == [t for c in calls for t in engine.calls[c]["ids"]]
        assert torch.allclose(
            torch.tensor(model_lps), torch.tensor([x for c in calls for x in engine.calls[c]["logprobs"]])
        )
        assert all(x == 0.0 for x, m in zip(lps, model, strict=True) if not m)
        assert len(model_ids) < n or len(calls) == 1
        offset = 0
        for c in calls:
            assert prompt + ids[:offset] == engine.calls[c]["context"]
            k = len(engine.calls[c]["ids"])
            assert ids[offset : offset + k] == engine.calls[c]["ids"]
            offset += k
            if offset < n:  # the tool message follows, as rendered once
                rendered = messages.render(replies[row])
                assert ids[offset : offset + len(rendered)] == rendered
                assert not any(model[offset : offset + len(rendered)])
                offset += len(rendered)
    m = tool_metrics(batch)
    assert m["turns_mean"] == 1.5 and m["tool_calls_mean"] == 0.5 and m["tool_call_rate"] == 0.5
    assert m["tool_errors"] == 1 and m["tool_errors_syntax"] == 1
    assert batch["tool_error_kinds"].shape == (4, len(ERROR_KINDS))


def test_a_call_at_the_last_turn_ends_the_episode_truncated(tokenizer):
    prompts = [tokenizer.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")]
    engine = ScriptedEngine(tokenizer, [CALL, CALL])
    episodes = run_episodes(
        engine,
        prompts,
        1,
        SamplingSpec(max_new_tokens=64),
        tools=ToolUse(dict(BUILTIN_TOOLS)),
        messages=ToolMessages(tokenizer),
        decode=decode(tokenizer),
        max_turns=2,
        max_total_tokens=4096,
    )
    assert episodes[0].turns == 2 and episodes[0].tool_calls == 2 and episodes[0].truncated
    assert len(engine.calls) == 2


STUCK_TOOL = '''
import threading

RELEASE = threading.Event()


def lookup(word: str) -> str:
    """Look a word up (and never answer)."""
    RELEASE.wait()
    return word
'''


def test_a_hung_user_tool_is_a_failed_tool_and_the_episode_goes_on(tokenizer, tmp_path):
    (tmp_path / "stuck.py").write_text(STUCK_TOOL)
    tools = configured_tools(
        OmegaConf.create([{"name": "lookup", "path": str(tmp_path / "stuck.py"), "timeout_seconds": 0.3}])
    )
    prompts = [tokenizer.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")]
    lookup = '<tool_call>{"name": "lookup", "arguments": {"word": "ratio"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, [lookup, "It did not answer. #### 1"])
    release = tools["lookup"].fn.__globals__["RELEASE"]
    try:
        episodes = run_episodes(
            engine,
            prompts,
            1,
            SamplingSpec(max_new_tokens=64),
            tools=ToolUse(tools),
            messages=ToolMessages(tokenizer),
            decode=decode(tokenizer),
            max_turns=3,
            max_total_tokens=4096,
        )
        assert not release.is_set()  # the episode ended while the tool still hung: it was abandoned, not waited for
    finally:
        release.set()
    [episode] = episodes
    assert episode.turns == 2 and not episode.truncated  # the model read the error and answered
    assert episode.tool_errors == {"timeout": 1}
    assert "error: lookup did not answer within 0.3 s" in tokenizer.decode(engine.calls[1]["context"])
    metrics = tool_metrics(pack_episodes(prompts, episodes, 1, pad_id=0))
    assert metrics["tool_errors"] == 1 and metrics["tool_errors_timeout"] == 1


def test_tool_use_pickles_without_its_abandoned_calls():
    import pickle
    import threading

    tools = ToolUse(dict(BUILTIN_TOOLS))
    tools._abandoned["calculator"] = [threading.Thread(target=lambda: None)]
    copy = pickle.loads(pickle.dumps(tools))  # to a collector actor
    assert copy.tools.keys() == tools.tools.keys() and copy._abandoned == {}


def test_the_loss_covers_model_tokens_only(tokenizer):
    prompts = [tokenizer.encode("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")]
    engine = ScriptedEngine(tokenizer, [CALL, "#### 42", "#### 7"])
    episodes = run_episodes(
        engine,
        prompts,
        2,
        SamplingSpec(max_new_tokens=64),
        tools=ToolUse(dict(BUILTIN_TOOLS)),
        messages=ToolMessages(tokenizer),
        decode=decode(tokenizer),
        max_turns=3,
        max_total_tokens=4096,
    )
    batch = pack_episodes(prompts, episodes, 2, pad_id=0)
    mask = loss_mask(batch)
    assert int(mask.sum()) < int(batch["response_mask"].sum())
    lp = batch["behavior_logprobs"].clone().requires_grad_(True)
    out = grpo_loss(
        lp,
        lp.detach(),
        torch.tensor([1.0, -1.0]),
        mask,
        behavior_logprobs=batch["behavior_logprobs"],
        settings=LossSettings(kl_coef=0.0),
    )
    out.loss.backward()
    tool = (batch["response_mask"] == 1) & (mask == 0)
    assert tool.any()
    assert torch.all(lp.grad[tool] == 0) and torch.all(lp.grad[mask.bool()] != 0)


def test_collector_runs_episodes_and_scores_the_last_turn(tokenizer, tmp_path):
    data = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "What is 6*7?", "ground_truth": "42"}, {"prompt": "What is 2+2?", "ground_truth": "4"}],
    )
    (tmp_path / "r.py").write_text(
        "def exact(responses, references):\n"
        "    return [float(r.strip().endswith(x)) for r, x in zip(responses, references)]\n"
    )
    tools = ["env.tools=[{name: calculator}]", "env.max_turns=3"]
    env = file_env(tokenizer, data, tmp_path / "r.py", "exact", extra=tools)
    system = tokenizer.decode(env.reset()["prompt_tokens"][0])
    assert "calculator" in system and "<tool_call>" in system  # the tools are described in the system prompt
    env = file_env(tokenizer, data, tmp_path / "r.py", "exact", extra=tools)
    engine = ScriptedEngine(tokenizer, [CALL, "#### 5", "The answer is 4", "#### 4", "The answer is 42"])
    collector = Collector(env, engine, tokenizer, group_size=2, max_new_tokens=64, tools=env.tool_use, max_turns=3)
    batch, _ = collector.collect(0, 0)
    assert batch["turns"].tolist() == [2, 1, 1, 1]
    assert list(batch["response_text"]) == ["The answer is 42", "#### 5", "The answer is 4", "#### 4"]
    assert batch["reward"].tolist() == [1.0, 0.0, 1.0, 1.0]


def test_a_template_without_tool_messages_is_a_config_error_when_the_env_is_built(tokenizer, tmp_path):
    import copy

    import pytest

    from grpo_rl.errors import ConfigError

    no_tools = copy.deepcopy(tokenizer)  # a template that silently drops tool messages
    no_tools.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'tool' %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    data = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "Q", "ground_truth": "1"}, {"prompt": "R", "ground_truth": "2"}]
    )
    (tmp_path / "r.py").write_text("def f(responses, references):\n    return [0.0] * len(responses)\n")
    with pytest.raises(ConfigError, match=r"env\.tools: .*chat template"):
        file_env(no_tools, data, tmp_path / "r.py", "f", extra=["env.tools=[{name: calculator}]", "env.max_turns=2"])
