"""The router folder (docs/router-format.md): `save_router` writes the weights, config, golden
vectors, model card and custom_generate/; `load_router` rebuilds a `LearnedRouter` with torch and
safetensors alone, refusing a damaged, edited or outdated folder with the fix. Both are public as
`router.model.save_router` / `router.model.load_router`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_file, save_file

from router.infra.files import check_stage, file_sha256
from router.model import ROUTER_FORMAT, LearnedRouter, RouterConfig, RouterError, RouterNet, check_feature_names
from router.records import SCHEMA_VERSION


def save_router(router: LearnedRouter | RouterNet, folder: str | Path) -> Path:
    """Write the router folder (docs/router-format.md): model.safetensors + config.json, golden vectors
    (not for a gru), a model card (README.md) and custom_generate/ (transformers' generate); returns it."""
    from router.export.card import write_model_card
    from router.export.golden import write_golden
    from router.hf.folder import write_custom_generate

    router = router if isinstance(router, LearnedRouter) else LearnedRouter(router, name=Path(folder).name)
    net, folder = router.net, Path(folder)
    check_stage(folder, "train")  # a router never goes into a record or eval folder, through any API
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(folder / "model.safetensors"))
    exported = {**asdict(net.cfg), "weights_sha256": file_sha256(folder / "model.safetensors")}  # checked on load
    (folder / "config.json").write_text(json.dumps(exported, indent=2, default=str))
    write_custom_generate(folder)  # the folder also decodes through transformers' generate(custom_generate=...)
    write_model_card(net.cfg, router.name, folder)
    if not router.offline_only:  # an offline-only router (a gru) has no stateless decision to pin
        write_golden(router, folder)
    return folder


def load_router(folder: str | Path) -> LearnedRouter:
    """Rebuild a router saved by save_router (torch + safetensors only)."""
    folder = Path(folder)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    if not cfg_path.exists() or not weights.exists():
        raise RouterError(
            f"{folder} is not a router folder (needs config.json and model.safetensors): "
            f"train one with `specroute train`"
        )
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as err:
        raise RouterError(
            f"{cfg_path} is not valid JSON ({err}): re-export the router with `specroute train`"
        ) from None
    if raw.get("format") != ROUTER_FORMAT or raw.get("schema_version") != SCHEMA_VERSION:
        raise RouterError(
            f"{folder} holds a router of format {raw.get('format')} / record schema "
            f"{raw.get('schema_version')}; this specroute reads format {ROUTER_FORMAT} / schema "
            f"{SCHEMA_VERSION}: retrain it"
        )
    recorded = raw.pop("weights_sha256", None)
    if recorded != file_sha256(weights):
        raise RouterError(
            f"{weights} is damaged or was changed after export (its checksum differs from the one in "
            f"{cfg_path.name}): retrain the router (`specroute train`) or restore the folder"
        )
    try:
        cfg = RouterConfig(**raw)
    except TypeError as err:
        raise RouterError(f"{cfg_path} is not a router config this version understands: {err}") from None
    check_feature_names(cfg.feature_names, folder.name)
    net = RouterNet(cfg)
    try:
        net.load_state_dict(load_file(str(weights)))
    except Exception as err:  # safetensors and torch raise several types for bad files and shapes
        raise RouterError(
            f"{weights} does not hold the weights {cfg_path.name} describes ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]}): the folder is damaged or was edited; retrain or "
            f"restore it"
        ) from None
    return LearnedRouter(net, name=folder.name)
