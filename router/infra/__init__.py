"""How commands run: atomic files and locks (`files`), config dataclasses from YAML and overrides
(`config`), terminal output (`console`), the clock (`clock`) and distributed ranks
(`distributed`)."""
