"""Hugging Face front ends of the decoding loop: `generate(custom_generate=...)` and Hub conventions.

  generate.py  `cascade_generate`: the in-process custom generation function (assistant_model=, rule=, alpha=)
  folder.py    every exported router folder is a `custom_generate` folder (remote-code route)
  settings.py  transformers' generation settings -> the loop's, refusing what it cannot honour
Guide: README, "Decoding with a trained router"; the contract for other engines: docs/router-format.md.
"""

from router.hf.generate import CascadeGenerateOutput, cascade_generate
from router.hf.settings import GenerationSettingError

__all__ = ["CascadeGenerateOutput", "GenerationSettingError", "cascade_generate"]
