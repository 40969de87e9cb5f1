"""custom_generate/ in every router folder: the file transformers runs for
`verifier.generate(..., custom_generate=<router folder>, trust_remote_code=True)`.

`write_custom_generate` adds `custom_generate/generate.py` (and a requirements.txt naming specroute) to an
export; the file hands the call to `router.hf.folder.folder_generate` (the remote-code route). It imports
nothing of specroute itself, so the router's save code can write it without an import cycle.
"""

from __future__ import annotations

from pathlib import Path

GENERATE_PY = '''"""Decode with the specroute router in this folder through Hugging Face `generate`.

    verifier.generate(**inputs, assistant_model=drafter, custom_generate=<this folder or its Hub id>,
                      trust_remote_code=True, alpha=0.2, max_new_tokens=64)

Written by specroute's export; the router is this folder's config.json + model.safetensors.
The decision contract: docs/router-format.md in specroute.
"""

try:
    from router.hf.folder import folder_generate
except ImportError as err:  # transformers checks requirements.txt first; this covers a specroute too old
    raise ImportError("this router folder decodes with specroute: pip install -U specroute") from err


def generate(model, *args, **kwargs):
    return folder_generate(model, *args, **kwargs)
'''


def write_custom_generate(folder: str | Path) -> Path:
    """custom_generate/generate.py + requirements.txt inside a router folder; returns the subfolder."""
    from importlib.metadata import PackageNotFoundError, version

    sub = Path(folder) / "custom_generate"
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "generate.py").write_text(GENERATE_PY)
    try:
        requirement = f"specroute>={version('specroute')}"
    except PackageNotFoundError:  # running from a source tree that is not installed
        requirement = "specroute"
    (sub / "requirements.txt").write_text(requirement + "\n")
    return sub
