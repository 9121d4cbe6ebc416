"""Migrations of the clicks job's stores, given to `localstate run job.toml --from-savepoint PATH
--migrate counts=migrate:counts_v2` (this file next to the job file)."""


def counts_v2(key, value):
    """counts: user -> clicks becomes user (lower case) -> {"clicks": n, "version": 2} (the job file
    now says value_serde = "json"); the bots' counts are dropped."""
    if key.startswith("bot-"):
        return None
    return key.lower(), {"clicks": value, "version": 2}
