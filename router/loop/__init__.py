"""The decoding loops' machinery, engine-agnostic (where models differ it asks their backend, router/backends/):
one speculative block top to bottom (`block`), the block sizes a policy decodes with (`block_size`), the loop's
counters (`stats`), settings (`options`), checks, rows and outputs every loop shares (`common`), KV caches and
ragged batches (`layout`), shared prompt prefixes (`prefix`), drafts looked up in a reference (`lookup`), the
autoregressive and lossless baselines (`baselines`), teacher-forced passes (`teacher`) and the tiny random pair
built from configs (`tiny`: tests, CI, the demo's tiny preset)."""
