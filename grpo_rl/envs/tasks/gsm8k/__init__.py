"""GSM8K: its environment and prompt templates (:mod:`.env`), its answer extraction and rewards (:mod:`.reward`)."""
