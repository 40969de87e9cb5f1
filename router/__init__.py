"""specroute core, importable without lightning or wandb, and importing no stage.

rules.py (the rule registry and the DeferralPolicy protocol) -> sampling.py (speculative sampling
towards pi) -> decoding.py (the speculative cascade loop; loop.py: what every loop shares;
layout.py: KV caches and ragged batches; baselines.py) -> features.py (the one features function)
-> model.py (router networks, load_router) -> record_view.py (router inputs from records, for train
and eval) -> tradeoff.py (offline curves) -> records.py (the record schema) -> pair.py (loading the
drafter/verifier pair; hardware.py: dtype auto; costs.py: the pair's costs on this machine).
Method: docs/method.md.
"""
