"""Window policies: deferral decisions that also read more than their own position. `follow` forms the
verifier's view of the drafts after each draft in a block (one function online and offline), `lag` the
features of the positions before the block, and `fly` is FLy's entropy gate plus deferred window as a
plug-in rule."""
