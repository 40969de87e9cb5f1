"""A learned router's architecture and config: what `specroute train` builds (`RouterArch`), what a router folder's
config.json holds (`RouterConfig`), what such a router reads while decoding (`router_needs`), and the checks that
refuse it on records or models of another pair or feature set. Imported by `router.model` (the networks) and
re-exported there: `from router.model import RouterConfig` is the public spelling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from router.features import CANDIDATE_FEATURE_NAMES, FEATURE_NAMES, JUDGE_FEATURE_NAMES
from router.inputs import judge_input_needs, judge_input_width, unknown_inputs
from router.policy import Needs
from router.records import SCHEMA_VERSION, Manifest

ARCHS = ("linear", "mlp", "gru")
HEADS = ("cascade", "token", "judge")
HIDDEN_ROLES = ("drafter", "verifier", "after")  # "after": the verifier's state after reading the drafted token
ROUTER_FORMAT = 3  # 3: config.json holds the weights' sha256 (checked on load); another format is refused


class RouterError(ValueError):
    """A router folder or router/data combination that cannot be used, with the fix."""


@dataclass
class RouterArch:
    """A router's architecture: what `specroute train` is told to build (TrainConfig.router) and the first
    part of every RouterConfig."""

    arch: str = "mlp"  # linear | mlp | gru (over the last `window` positions)
    head: str = "cascade"  # cascade | token (scores each drafter candidate; target token_label) |
    # judge (decides the drafted token; target greedy_01_gap; judge records)
    width: int = 64  # hidden units per layer (mlp, gru)
    depth: int = 2  # layers (mlp)
    window: int = 4  # gru: positions of context, the current one included
    hidden_inputs: list = field(default_factory=list)  # "drafter" / "verifier" / "after" (judge): append that
    # model's last hidden state
    follow: int = 0  # judge: a window judge reading the next `follow` drafts of the block (router/window/follow.py;
    # records with window >= it)
    follow_block: int = 0  # window judge: the block size its windows were cut for in training (the gamma it decodes
    # at: a draft at block position j has g - 1 - j followers); 0: uncut
    lag: int = 0  # judge: a lag judge reading the features of the `lag` positions before the drafted one
    # (router/window/lag.py), at most 8
    running: bool = False  # judge: also read the answer so far (means of the verifier's confidence, agreement,
    # TV and entropy over every earlier position, and their count: router/window/running.py)
    extra_inputs: dict = field(default_factory=dict)  # judge: inputs added with router.inputs.register_input,
    # {name: size} (docs/rules.md, "Adding a router input")

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise RouterError(f"unknown router arch {self.arch!r}: arch must be one of {', '.join(ARCHS)}")
        if self.head not in HEADS:
            raise RouterError(f"unknown router head {self.head!r}: head must be one of {', '.join(HEADS)}")
        for name in ("width", "depth", "window"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise RouterError(f"{name} must be >= 1 (an integer), got {getattr(self, name)!r}")
        unknown = [role for role in self.hidden_inputs if role not in HIDDEN_ROLES]
        if unknown:
            raise RouterError(f"hidden_inputs must name {'/'.join(HIDDEN_ROLES)}, got {self.hidden_inputs}")
        if "after" in self.hidden_inputs and self.head != "judge":
            raise RouterError(
                "hidden input 'after' (the verifier's state after the drafted token) belongs to a "
                "drafted token: use it with head: judge"
            )
        if self.head in ("judge", "token") and self.arch == "gru":
            raise RouterError(
                f"the {self.head} head scores {'each drafted token' if self.head == 'judge' else 'candidate tokens'} "
                f"one by one: use arch linear or mlp with it"
            )
        if self.follow and self.head != "judge" or self.follow < 0:
            raise RouterError(
                f"follow (drafts read after the drafted one) needs head: judge and >= 0, got {self.follow}"
            )
        if self.follow_block and not self.follow or self.follow_block < 0:
            raise RouterError(
                f"follow_block={self.follow_block} cuts a window judge's windows: it needs follow > 0 (the drafts "
                f"read) and is >= 0"
            )
        if self.lag and self.head != "judge" or not 0 <= self.lag <= 8:
            raise RouterError(f"lag (positions read before the drafted one) needs head: judge and 0..8, got {self.lag}")
        if not isinstance(self.running, bool) or self.running and self.head != "judge":
            raise RouterError(
                f"running (inputs summed over the answer so far) is true or false and needs head: judge, got "
                f"{self.running!r} with head {self.head}"
            )
        self._check_extra_inputs()

    def _check_extra_inputs(self) -> None:
        if not isinstance(self.extra_inputs, dict):
            raise RouterError(f"extra_inputs is a mapping {{name: size}}, got {self.extra_inputs!r}")
        unknown = unknown_inputs(self)
        if unknown:
            raise RouterError(f"extra_inputs names {unknown}: register them first (router.inputs.register_input)")
        bad = {k: v for k, v in self.extra_inputs.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0}
        if bad:
            raise RouterError(f"extra_inputs sizes are integers >= 0, got {bad}")
        if any(self.extra_inputs.values()) and self.head != "judge":
            raise RouterError(f"extra_inputs {self.extra_inputs} are a judge's inputs: use them with head: judge")


@dataclass
class RouterConfig(RouterArch):
    """Architecture (RouterArch) and provenance of a trained router; saved as config.json next to the weights."""

    token_candidates: int = 32  # token head: drafter tokens scored per position
    feature_names: list = field(default_factory=lambda: list(FEATURE_NAMES))
    hidden_sizes: dict = field(default_factory=dict)  # the widths of hidden_inputs, e.g. {"verifier": 1536}
    vocab: int = 0  # judge head: size of its token class table (the pair's vocabulary)
    schema_version: int = SCHEMA_VERSION
    records_id: str = ""  # manifest id of the training records
    pair: dict = field(default_factory=dict)  # drafter/verifier/tokenizer hashes of the training records
    alpha_grid: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    trained_on: dict = field(default_factory=dict)  # records, tasks, models, label, examples (the model card's)
    format: int = ROUTER_FORMAT

    def __post_init__(self):
        super().__post_init__()
        missing = [role for role in self.hidden_inputs if not self.hidden_sizes.get(role)]
        if missing:
            raise RouterError(
                f"hidden_inputs {self.hidden_inputs} need a size each in hidden_sizes; got {self.hidden_sizes}"
            )
        if self.head == "judge" and self.vocab < 1:
            raise RouterError(
                "the judge head reads each drafted token's class: set vocab (train sets it from the records)"
            )

    @classmethod
    def built(cls, arch: RouterArch, **provenance) -> "RouterConfig":
        """The config of a router built to `arch`, with what training learned about it (sizes, records, metrics)."""
        return cls(**asdict(arch), **provenance)

    @property
    def position_dim(self) -> int:
        """Width of the per-position input: features (the judge's own for that head), then hidden
        states in hidden_inputs order."""
        base = len(JUDGE_FEATURE_NAMES) + judge_input_width(self) if self.head == "judge" else len(self.feature_names)
        return base + sum(self.hidden_sizes[r] for r in self.hidden_inputs)

    @property
    def input_dim(self) -> int:
        return self.position_dim + (len(CANDIDATE_FEATURE_NAMES) if self.head == "token" else 0)


def check_router_pair(cfg: RouterConfig, manifest: Manifest, who: str) -> None:
    """Refuse to apply a router to records (or models) of another pair than it was trained on."""
    here = manifest.pair
    if cfg.pair and cfg.pair != here:
        raise RouterError(
            f"router {who} was trained on the pair {cfg.pair}, these records come from {here}: "
            f"train a router on records of this pair (`specroute gen` then `specroute train`)"
        )


def check_feature_names(names, who: str) -> None:
    """Refuse a router whose features are not the ones `router/features.py` computes."""
    if list(names) != list(FEATURE_NAMES):
        raise RouterError(
            f"router {who} was trained on features {list(names)}, this specroute computes "
            f"{list(FEATURE_NAMES)}: retrain it on records from this version"
        )


def router_needs(cfg: RouterConfig) -> Needs:
    """What a router of this config reads (router.policy.Needs): the logits (cheaper features), its hidden
    states; a judge the drafts and the lookahead (and no q at the bonus position: it takes p there), the
    others q at the bonus position; a window judge its follow window, a lag judge the positions before."""
    head = {"drafts", "lookahead"} if cfg.head == "judge" else {"bonus_q"}
    hidden = {f"hidden_{role}" for role in cfg.hidden_inputs}
    sized = judge_input_needs(cfg)  # what its extra inputs need the loop to provide (router/inputs.py)
    return Needs({"logits", *head, *hidden, *sized.pop("inputs", ())}, **sized)
