"""Hub conventions for routers: `save_pretrained`, `from_pretrained` (a folder or a Hub id) and
`push_to_hub`, through huggingface_hub's ModelHubMixin. A router folder on the Hub is the same
folder `save_router` writes (weights, config, golden vectors, model card, custom_generate/), so a Hub
id works wherever a folder does: `LearnedRouter.from_pretrained("user/router")`, or
`verifier.generate(..., custom_generate="user/router", trust_remote_code=True)`.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelHubMixin


class RouterHubMixin(
    ModelHubMixin,
    library_name="specroute",
    tags=["specroute", "speculative-decoding", "custom_generate"],
    pipeline_tag="text-generation",
):
    """save_pretrained / from_pretrained / push_to_hub for `router.model.LearnedRouter`, which supplies the
    two hooks (`_write_router_folder`, `_read_router_folder`: its module's save_router / load_router), so
    this module needs nothing of the model's."""

    def _save_pretrained(self, save_directory: Path) -> None:
        self._write_router_folder(save_directory)

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        token: str | bool | None = None,
        **kwargs,
    ):
        download = dict(revision=revision, cache_dir=cache_dir, force_download=force_download, token=token)
        return cls._read_router_folder(local_folder(model_id, local_files_only=local_files_only, **download))


class HubFolderError(ValueError):
    """A router source that is neither a local folder nor a Hub repo that could be fetched."""


def local_folder(source: str | Path, **download) -> Path:
    """A router folder on this machine: `source` itself when it is a folder, else the snapshot of the
    Hub repo `source` (huggingface_hub's cache: no download when it is cached), with a clear error."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=str(source), **download))
    except Exception as err:  # offline, unknown repo, no access: one message naming the source
        raise HubFolderError(
            f"{source!r} is neither a local router folder nor a Hub repo that could be fetched "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160]}): pass a folder, or check the id and network"
        ) from None
