"""specroute core, importable without lightning or wandb, and importing no stage.

The method and the public API (design.md), at the top:
  rules.py     the rule registry and the DeferralPolicy protocol
  sampling.py  speculative sampling towards a target pi
  decoding.py  the speculative cascade loop (`generate`)
  features.py  the one features function, used when recording and when decoding
  records.py   the record schema and its Manifest
  model.py     router networks, save / `load_router`
  pair.py      loading the drafter / verifier pair (the embedded one included)
  reduce.py    exact blocked reductions over the vocabulary (a kernel the loop and features share)
The machinery, by role:
  engine/      what every decoding loop shares (loop, layout, prefix, lookup, baselines, teacher, tiny)
  machine/     this machine (hardware, costs, calibrate)
  offline/     record inputs for routers, trade-off curves, views, cross-fitting folds
  tasks/       prompt formats, stop strings, metrics, the sandbox (prompts, metrics, sandbox)
  infra/       files, config, console, clock, distributed
The front ends and exports:
  hf/          Hugging Face generate: cascade_generate, router folders as custom_generate folders
  export/      the decision contract: decision module, golden vectors, ONNX, model card, Hub
Method: docs/method.md.
"""
