"""Generated arithmetic problems, served and scored as GSM8K (:mod:`.problems`)."""
