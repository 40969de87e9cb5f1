"""specroute eval stage (see design.md); filled in by its own issue."""
