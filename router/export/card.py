"""The model card (README.md) written into every exported router folder.

Hugging Face reads the YAML header (library, tags: `custom_generate` marks a folder whose
`custom_generate/generate.py` replaces `generate`); people read the rest: what the router decides,
the pair it was trained on, its training data, its validation areas and how to decode with it.
"""

from __future__ import annotations

import json
from pathlib import Path

HEADER = """---
library_name: specroute
tags:
- custom_generate
- specroute
- speculative-decoding
- speculative-cascades
pipeline_tag: text-generation
---
"""

HEADS = {
    "cascade": "defers a whole position to the verifier where its predicted quality gap exceeds alpha x TV(p, q)",
    "token": "keeps each of the drafter's top candidate tokens whose predicted gap is at most alpha",
    "judge": "keeps a drafted token whose predicted gap is at most alpha, reading the verifier's view after it",
}


def model_card(cfg, name: str) -> str:
    """README.md text for a router config (`router.model.RouterConfig`)."""
    trained = cfg.trained_on or {}
    models = trained.get("models") or {}
    pair = ", ".join(
        f"{role} `{cfg.pair[role]}`" for role in ("drafter", "verifier", "tokenizer") if cfg.pair.get(role)
    )
    lines = [
        HEADER,
        f"# specroute router `{name}`",
        "",
        f"A learned deferral policy for speculative cascades ({cfg.head} head, {cfg.arch}): it {HEADS[cfg.head]}. "
        "Trained with [specroute](https://github.com/specroute/specroute); the decision contract for other "
        "engines is specroute's `docs/router-format.md`, checked by this folder's `golden.safetensors`.",
        "",
        "## Pair",
        "",
        f"- drafter: {models.get('drafter') or 'unnamed'}; verifier: {models.get('verifier') or 'unnamed'}",
        f"- records computed by: {', '.join(trained.get('engine') or ['torch'])} (specroute's engines: torch, llamacpp)",
        f"- weight fingerprints: {pair or 'not recorded (decodes with any pair)'}; decoding with other models is "
        "refused unless `check_pair=False`",
        f"- inputs: {', '.join(cfg.feature_names) if cfg.head != 'judge' else 'judge features'}"
        + (f"; hidden states: {', '.join(cfg.hidden_inputs)}" if cfg.hidden_inputs else ""),
        "",
        "## Training data",
        "",
        *_training_lines(cfg, trained),
        "",
        "## Validation",
        "",
        *_validation_lines(cfg.metrics or {}),
        "",
        "## Decoding with it",
        "",
        "```python",
        'out = verifier.generate(**inputs, assistant_model=drafter, custom_generate="<this folder or Hub id>",',
        "                        trust_remote_code=True, alpha=0.2, max_new_tokens=128)",
        "# without remote code:",
        "from router.hf import cascade_generate",
        "out = verifier.generate(**inputs, custom_generate=cascade_generate, assistant_model=drafter,",
        '                        rule="<this folder>", alpha=0.2, max_new_tokens=128)',
        "```",
        "",
        'Command line: `specroute generate --router <this folder> --alpha 0.2 --prompt "..."`. '
        "alpha is a threshold on the predicted gap; eval's report lists the alphas matched to rejection rates.",
        "",
    ]
    return "\n".join(lines)


def _training_lines(cfg, trained: dict) -> list[str]:
    if not trained:
        return [f"- records: `{cfg.records_id or 'unknown'}`"]
    return [
        f"- records: {', '.join(f'`{r}`' for r in trained.get('records', []))} (manifest ids `{cfg.records_id}`)",
        f"- tasks: {', '.join(trained.get('tasks', [])) or 'unknown'}",
        f"- label: `{trained.get('target')}`, loss `{trained.get('loss')}`, {trained.get('train_rows', 0)} training rows",
        f"- examples per split: `{json.dumps(trained.get('examples', {}), sort_keys=True)}`",
    ]


def _validation_lines(metrics: dict) -> list[str]:
    router = metrics.get("router") or {}
    if not router:
        return ["- no validation metrics were recorded with this export"]
    best = max((metrics.get("plugins_greedy") or {}).items(), key=lambda kv: kv[1], default=(None, None))
    lines = [
        f"- area under the quality/rejection curve: {router.get('area', float('nan')):.4f} "
        f"(greedy view {router.get('greedy_area', float('nan')):.4f})",
    ]
    if best[0]:
        lines.append(f"- best plug-in rule on the same validation split, greedy view: {best[0]} {best[1]:.4f}")
    return lines


def write_model_card(cfg, name: str, folder: str | Path) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(model_card(cfg, name))
    return path
