"""A user's own task: prompts from files or a hub data set (:mod:`.env`), scored by the user's reward functions."""
