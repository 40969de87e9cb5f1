"""specroute: speculative cascades with learned deferral routers.

For Python users, the public API in one namespace (each name is the core's own object, loaded on first use so
that `specroute`'s command line starts without torch):

    import specroute
    drafter, verifier, tokenizer = specroute.load_pair("embedded")   # or hub ids / local folders
    out = specroute.generate(drafter, verifier, input_ids, rule="opt", alpha=0.3, gamma=4)
    rule = specroute.get_rule("token_v2"); specroute.register_rule(my_rule)   # router.rules
    router = specroute.load_router("runs/routers/token")               # a trained router, used as rule=

Also `Rule`, `Needs`, `BlockView` (writing a rule of your own, docs/rules.md) and `RULES` (the registered names).

This package is also the face of specroute: the `specroute` command (cli.py) and the demo that chains the
stages (demo.py, with its time estimate in estimate.py). The stages (data_gen, train, eval) and the core
(router) never import this package; it reaches the stages only through their run functions and config objects.
"""

from __future__ import annotations

import importlib

# name -> the core module that defines it: the one list of what `import specroute` offers
PUBLIC_API = {
    "generate": "router.decoding",
    "load_pair": "router.pair",
    "load_router": "router.model",
    "get_rule": "router.rules",
    "register_rule": "router.rules",
    "RULES": "router.rules",
    "Rule": "router.policy",
    "Needs": "router.policy",
    "BlockView": "router.view",
}
__all__ = sorted(PUBLIC_API)


def __getattr__(name: str):
    if name not in PUBLIC_API:
        raise AttributeError(f"module 'specroute' has no attribute {name!r} (its API: {', '.join(__all__)})")
    value = getattr(importlib.import_module(PUBLIC_API[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
