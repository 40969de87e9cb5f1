"""Tasks: prompt formats and stop strings (`prompts`), answer metrics (`metrics`) and the sandbox
that runs generated programs (`sandbox`)."""
