"""A quiet start: the known, harmless start-up messages of vLLM, torch, transformers and wandb are dropped.

Before the first step a default CPU run printed about 130 lines, most of them one warning per weight ("Attempted
to load weight ... float32 into ... bfloat16": the engine's intended cast of an fp32 folder) and notices that
say nothing about this run (Triton absent on a CPU, tcmalloc not preloaded, eager mode chosen on purpose). Each
message dropped here is listed by a fragment of its text; anything not listed still prints, so a new or real
warning is never hidden. ``GRPO_VERBOSE=1`` turns all of this off.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import warnings
from pathlib import Path

# Fragments of messages that are expected on every run of this project and carry no information for its user.
BENIGN = (
    "Attempted to load weight",  # the fp32 model folder cast into a bf16 engine, once per tensor
    "The global random seed is set to",  # in-process vLLM seeds the RNGs; the scripts seed after it
    "does not officially support disabling chunked prefill",  # disabled on purpose (seeded CPU sampling)
    "Enforce eager set",
    "Inductor compilation was disabled",
    "Triton is not installed",
    "Triton not installed",
    "Triton not available",
    "Model Runner V2 requires Triton",
    "Reset SSM cache type",
    "is not found in LD_PRELOAD",
    "leaving Torch threads at",
    "doesn't allow to use `torch.set_num_threads`",
    "RotaryEmbedding: Failed to load weights",  # every in-place reload: the rotary cache is a buffer, not a weight
    "is an Enum subclass and is now natively supported by torch.compile",  # torchao's enums (optimizer.name)
    # torchao, where it is installed (the lowmem extra), is imported by vLLM and transformers whether or not its
    # optimizer is chosen; on a CPU it notes its absent CUDA kernels and Triton.
    "torchao/_C_",
    "Detected no triton",
    "Token authentication is enabled for this Ray cluster",  # Ray's default for a local instance, kept on purpose
)
_PATTERN = re.compile("|".join(re.escape(fragment) for fragment in BENIGN))


class BenignMessageFilter(logging.Filter):
    """Drops records whose message contains one of :data:`BENIGN`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _PATTERN.search(record.getMessage())


_FILTER = BenignMessageFilter()


def verbose() -> bool:
    return os.environ.get("GRPO_VERBOSE", "") not in ("", "0")


def filter_handlers(logger_name: str | None = None) -> None:
    """Attach the filter to ``logger_name``'s handlers (root by default) and the logger itself. Libraries that
    configure their own handlers (vLLM) are filtered after they are imported."""
    if verbose():
        return
    logger = logging.getLogger(logger_name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    for handler in logger.handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)


def vllm_logging_config() -> None:
    """Point vLLM at a logging config that is its default (at WARNING, unless ``VLLM_LOGGING_LEVEL`` says
    otherwise) plus :class:`BenignMessageFilter` on its handler; call before vLLM is imported.

    vLLM replaces its handlers with ``dictConfig`` whenever an engine starts, so a filter attached from outside
    would be dropped; ``VLLM_LOGGING_CONFIG_PATH`` is its supported way in.
    """
    if verbose() or os.environ.get("VLLM_LOGGING_CONFIG_PATH"):  # a config file the user set is kept
        return
    # WARNING unless the user asks for more: vLLM's INFO lines (about 20 at each engine start: its arguments, the
    # resolved architecture, the KV cache size) describe choices the run's own banner already states.
    level = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING").upper()
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"benign": {"()": f"{__name__}.BenignMessageFilter"}},
        "formatters": {
            "vllm": {
                "()": "vllm.logging_utils.NewLineFormatter",
                "datefmt": "%m-%d %H:%M:%S",
                "format": "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] "
                "%(message)s",
            }
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "level": level,
                "stream": "ext://sys.stdout",
                "filters": ["benign"],
            }
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
    }
    path = Path(tempfile.gettempdir()) / f"grpo_rl-vllm-logging-{level.lower()}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: concurrent runs share it
    tmp.write_text(json.dumps(config))
    tmp.replace(path)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)


def quiet_start() -> None:
    """Call once at the start of a script (after logging is configured): filters, progress bars, banners."""
    if verbose():
        return
    quiet_logging()
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars for sub-second jobs
    except ImportError:
        pass


def quiet_logging() -> None:
    """The filters of :func:`quiet_start` alone, which import nothing: an actor's module calls it before its own
    imports (transformers, and with it torchao where installed, print on import)."""
    if verbose():
        return
    filter_handlers()
    # A logger's own filter drops its records before any handler sees them, even Python's last-resort handler (a
    # Ray worker's torchao notices); a handler's filter also covers the records of the loggers below it.
    for name in (
        "torch",
        "torch._library.triton",
        "vllm",
        "vllm.triton_utils.importing",
        "torchao",
        "torchao.kernel.intmm",
        "ray._private.authentication.authentication_token_setup",
    ):
        filter_handlers(name)
    warnings.filterwarnings("ignore", message=r".*reduce_op.* is deprecated", category=FutureWarning)
    os.environ.setdefault("WANDB_SILENT", "true")  # the run's banner already says where wandb writes
    # A served engine's client: one INFO line per HTTP request (dozens a step); failures are raised, not logged.
    logging.getLogger("httpx").setLevel(logging.WARNING)
