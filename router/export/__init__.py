"""Exporting routers for other engines and for the Hub.

  decision.py  the stateless decision of a router head from the two models' logits (torch module)
  golden.py    golden vectors written with every export, and `reproduce` to check a port against them
  onnx.py      `specroute export-onnx DIR`: the decision as ONNX, checked with onnxruntime
  card.py      the model card (README.md) of every export
  hub.py       save_pretrained / from_pretrained / push_to_hub (huggingface_hub's ModelHubMixin)
  custom_generate.py  custom_generate/ written into every export (transformers' remote-code route)
The folder itself is written and read by `router.model.save_router` / `load_router`.
The contract: docs/router-format.md.
"""
