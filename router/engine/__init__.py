"""What every decoding loop shares: settings, checks, rows and stats (`loop`), KV caches and ragged
batches (`layout`), how the loop calls a policy (`policy_call`), shared prompt prefixes (`prefix`),
drafts looked up in a reference (`lookup`), the autoregressive and lossless baselines
(`baselines`), teacher-forced passes (`teacher`) and the tiny random pair built from configs
(`tiny`: tests, CI, the demo's tiny preset)."""
