"""specroute core, importable without lightning or wandb, and importing no stage.

The method and the public API, at the top:
  policy.py    the deferral-policy interface: the DeferralPolicy protocol, `Needs` and `Rule`
  view.py      `BlockView`: what a policy decides from (`policy.decide(view, alpha) -> pi`)
  rules.py     the rule registry (`get_rule`, `RULES`, `register_rule`): the one place that knows rule names
  targets.py   the plug-in rules' pure functions: targets (torch) and offline scores (numpy)
  sampling.py  speculative sampling towards a target pi
  decoding.py  the speculative cascade loop (`generate`)
  features.py  the one features function, used when recording and when decoding
  records.py   the record schema and its Manifest
  model.py     router networks, `save_router` / `load_router`
  pair.py      loading the drafter / verifier pair (the embedded one and the tiny one included)
  reduce.py    exact blocked reductions over the vocabulary (a kernel the loop and features share)
The machinery, by role:
  engine/      the loops' machinery: one block (block), block sizes, stats, loop, layout, prefix, lookup,
               baselines, teacher, tiny models
  window/      inputs beyond one position: the follow window of a block's drafts, the lag history, FLy
  machine/     this machine (hardware, costs, calibrate)
  offline/     record inputs for routers, trade-off curves, views, cross-fitting folds
  tasks/       prompt formats, stop strings, metrics, the sandbox (prompts, metrics, sandbox)
  infra/       files, config, console, clock, distributed
The front ends and exports:
  hf/          Hugging Face generate: cascade_generate, router folders as custom_generate folders
  vllm/        the vLLM plugin (policies deciding acceptance in vLLM's speculative decoding) and vLLM engines
               driven from specroute's commands (served.py)
  export/      the decision contract: decision module, golden vectors, ONNX, model card, Hub, custom_generate/
Method: docs/method.md.
"""
