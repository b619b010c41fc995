"""The tasks, one room each: ``gsm8k``, ``ifeval``, ``arithmetic`` and ``file`` (a user's prompts), the values of
``env.dataset``."""
