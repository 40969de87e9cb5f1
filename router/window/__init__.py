"""Window policies: deferral decisions that also read the verifier's view of the drafts after each
draft in a block. `inputs` forms those inputs (one function online and offline); `fly` is FLy's
entropy gate plus deferred window as a plug-in rule."""
