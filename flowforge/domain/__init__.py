"""The rules, with no I/O: the domain's words, definitions, templates, cron, the engine."""
