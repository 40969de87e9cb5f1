"""Model loading (local folders, tokenizer checks, embedded pair errors) and the CLI, on tiny models."""

import json

import pytest
from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast

from helpers import tiny_qwen
from router import pair as rmodels
from router.infra import embedded
from specroute import cli

TOK_VOCAB = 300  # byte-level BPE: 256 bytes + specials + a few merges


def tiny_tokenizer(corpus: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a tiny corpus (Qwen2's tokenizer class can load it)."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([corpus] * 20, vocab_size=TOK_VOCAB, special_tokens=["<pad>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    text, other = "the cat sat on the mat with the hat", "a dog ran in a fog to a log"
    for name, model, tok in (
        ("drafter", tiny_qwen(1, 1, 32, vocab=TOK_VOCAB), tiny_tokenizer(text)),
        ("verifier", tiny_qwen(2, vocab=TOK_VOCAB), tiny_tokenizer(text)),
        ("other", tiny_qwen(3, vocab=TOK_VOCAB), tiny_tokenizer(other)),
    ):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def test_load_pair_from_local_folders(saved_pair):
    drafter, verifier, tok = rmodels.load_pair(str(saved_pair / "drafter"), str(saved_pair / "verifier"))
    assert len(tok("the cat").input_ids) > 0 and drafter.config.num_hidden_layers == 1


def test_tokenizer_mismatch_is_refused(saved_pair):
    with pytest.raises(ValueError, match="tokenizers differ"):
        rmodels.load_pair(str(saved_pair / "drafter"), str(saved_pair / "other"))


def test_missing_embedded_parts_give_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path))
    fake = embedded.EmbeddedModel("nothing", "specroute_no_such_pkg_part", 2, 1, "0")
    monkeypatch.setitem(embedded.EMBEDDED, "drafter", fake)
    with pytest.raises(FileNotFoundError, match=r"specroute\[models\]"):
        embedded.embedded_path("drafter")
    assert not embedded.embedded_installed()


def test_missing_gguf_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rmodels.resolve_model_path(str(tmp_path / "model.gguf"))


def test_cli_generate_marks_sources_and_writes_json(saved_pair, tmp_path, capsys):
    out = tmp_path / "gen.json"
    rc = cli.main(
        [
            "generate",
            "--prompt",
            "the cat sat on",
            "--drafter",
            str(saved_pair / "drafter"),
            "--verifier",
            str(saved_pair / "verifier"),
            "--rule",
            "token_v3",
            "--alpha",
            "0.5",
            "--max-new-tokens",
            "12",
            "--dtype",
            "float32",
            "--compare",
            "--output",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    result = json.loads(out.read_text())
    assert len(result["tokens"]) == result["stats"]["new_tokens"] > 0
    assert set(result["sources"]) <= {0, 1}
    assert "speed-up vs verifier" in printed and "rejection rate" in printed
    if 1 in result["sources"]:
        assert "[[" in printed  # verifier-step tokens are marked when not on a terminal
    # a stop text (typed with a shell escape) ends the output where it first appears
    stop = result["text"][3:5]
    assert (
        stop
        and cli.main(
            [
                "generate",
                "--prompt",
                "the cat sat on",
                "--drafter",
                str(saved_pair / "drafter"),
                "--verifier",
                str(saved_pair / "verifier"),
                "--rule",
                "token_v3",
                "--alpha",
                "0.5",
                "--max-new-tokens",
                "12",
                "--dtype",
                "float32",
                "--stop",
                stop.encode("unicode_escape").decode(),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    stopped = json.loads(out.read_text())
    assert stopped["text"] == result["text"].split(stop, 1)[0] and len(stopped["tokens"]) < len(result["tokens"])
    with pytest.raises(SystemExit, match="non-empty"):
        cli.main(["generate", "--prompt", "the", "--stop", ""])
    # gamma chosen from measured costs, and blocks that end where the drafter is unsure
    assert (
        cli.main(
            [
                "generate",
                "--prompt",
                "the cat sat on",
                "--drafter",
                str(saved_pair / "drafter"),
                "--verifier",
                str(saved_pair / "verifier"),
                "--rule",
                "lossless",
                "--gamma",
                "auto",
                "--draft-stop",
                "0.5",
                "--max-new-tokens",
                "12",
                "--dtype",
                "float32",
                "--bonus-from",
                "verifier",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    auto = json.loads(out.read_text())
    stats = auto["stats"]  # a tiny pair's drafter costs what its verifier does: steps by the verifier alone count too
    assert stats["gamma"] == "auto" and sum(stats["gamma_chosen"].values()) == stats["blocks"] + stats["verifier_steps"]
    printed = capsys.readouterr().out
    assert stats["draft_stop"] == 0.5 and stats["bonus_from"] == "verifier" and "blocks per gamma" in printed
    assert ("speculation does not pay" in printed) == (stats["verifier_steps"] > 0)
    with pytest.raises(SystemExit):
        cli.main(["generate", "--prompt", "the", "--gamma", "fast"])


def test_cli_errors_are_messages_not_tracebacks(saved_pair, capsys):
    rc = cli.main(
        [
            "generate",
            "--prompt",
            "the",
            "--drafter",
            str(saved_pair / "drafter"),
            "--verifier",
            str(saved_pair / "other"),
            "--dtype",
            "float32",
        ]
    )
    assert rc == 2 and "tokenizers differ" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="outside chow's range"):
        cli.main(["generate", "--prompt", "the", "--rule", "chow", "--alpha", "2"])


def test_cli_rules_lists_every_rule(capsys):
    assert cli.main(["rules"]) == 0
    printed = capsys.readouterr().out
    for name in ("chow", "opt", "token_v3", "lossy", "lossless", "drafter"):
        assert name in printed


def test_gguf_models_also_end_at_endoftext():
    from router.pair import gguf_end_tokens

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

        def convert_tokens_to_ids(self, token):
            return self.vocab[token]

    qwen = Tok({"<|im_end|>": 151645, "<|endoftext|>": 151643, "a": 5})
    assert gguf_end_tokens(qwen, 151645) == [151645, 151643]  # as Qwen's released generation config
    assert gguf_end_tokens(qwen, [151645, 151643]) == [151645, 151643]
    assert gguf_end_tokens(Tok({"</s>": 2}), 2) == 2  # no such token: unchanged
    assert gguf_end_tokens(qwen, None) is None


def test_a_verifier_loads_with_an_accelerate_device_map(saved_pair, monkeypatch):
    """verifier_device_map (a verifier too large for one device) goes to from_pretrained for the
    verifier only; on a CPU-only machine 'auto' leaves it on the CPU and the pair decodes as before."""
    import torch
    from transformers import AutoModelForCausalLM

    calls, original = [], AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM,
        "from_pretrained",
        lambda *a, **kw: calls.append(kw.get("device_map")) or original(*a, **kw),
    )
    drafter, verifier, _ = rmodels.load_pair(
        str(saved_pair / "drafter"), str(saved_pair / "verifier"), dtype="float32", verifier_device_map="auto"
    )
    assert calls == [None, "auto"] and next(verifier.parameters()).device.type == "cpu"
    plain = rmodels.load_pair(str(saved_pair / "drafter"), str(saved_pair / "verifier"), dtype="float32")[1]
    ids = torch.tensor([[3, 5, 7, 9]])
    assert torch.equal(verifier(ids).logits, plain(ids).logits)
    with pytest.raises(ValueError, match="saved model"):
        rmodels.load_pair("tiny:drafter", "tiny:verifier", verifier_device_map="auto")


def test_generate_decodes_with_a_router_folder_on_its_own_pair_only(tmp_path, capsys, monkeypatch, tiny):
    """`specroute generate --router DIR` decodes as `generate(rule=router)` does; a router is refused on
    models other than the ones it was trained on (named both ways), unless the check is turned off."""
    import torch

    import router.backends.torch_models as tiny_module  # where load_pair builds the tiny pair
    from router.decoding import generate
    from router.pair import tiny_pair
    from router.model import LearnedRouter, RouterConfig, RouterNet, load_router, save_router
    from router.pair import pair_identity

    torch.manual_seed(0)
    folder = save_router(LearnedRouter(RouterNet(RouterConfig(pair=pair_identity(*tiny)))), tmp_path / "mlp")
    out = tmp_path / "g.json"
    base = [
        "generate",
        "--drafter",
        "tiny:drafter",
        "--verifier",
        "tiny:verifier",
        "--dtype",
        "float32",
        "--prompt",
        "Add 2 and 3.",
        "--max-new-tokens",
        "12",
        "--alpha",
        "0.2",
        "--output",
        str(out),
    ]
    assert cli.main([*base, "--router", str(folder)]) == 0
    said = capsys.readouterr().out
    assert f"router       {folder}" in said or f"{folder} (alpha 0.2" in said
    result = json.loads(out.read_text())
    ids = torch.tensor([tiny.tokenizer.encode("Add 2 and 3.", add_special_tokens=False)])
    python = generate(tiny.drafter, tiny.verifier, ids, rule=load_router(folder), alpha=0.2, max_new_tokens=12)
    assert result["tokens"] == python.sequences[0, ids.shape[1] :].tolist()
    # another pair (same architecture, other weights): refused in the CLI and in Python
    other = tiny_pair(seed=5)
    monkeypatch.setattr(tiny_module, "tiny_pair", lambda *a, **k: other)
    assert cli.main([*base, "--router", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "the loaded drafter and verifier differ from the ones router" in err and "there," in err
    with pytest.raises(ValueError, match="differ from the ones router mlp was made with"):
        generate(other.drafter, other.verifier, ids, rule=load_router(folder), alpha=0.2, max_new_tokens=4)
    assert cli.main([*base, "--router", str(folder), "--no-pair-check"]) == 0
    generate(
        other.drafter, other.verifier, ids, rule=load_router(folder), alpha=0.2, max_new_tokens=4, check_pair=False
    )
    with pytest.raises(SystemExit):  # --rule and --router together, even --rule opt (the default)
        cli.main([*base, "--router", str(folder), "--rule", "opt"])
    assert "not allowed with argument --router" in capsys.readouterr().err


def test_a_gru_router_folder_is_refused_before_the_models_load(tmp_path, capsys):
    from router.model import LearnedRouter, RouterConfig, RouterNet, save_router

    folder = save_router(LearnedRouter(RouterNet(RouterConfig(arch="gru"))), tmp_path / "gru")
    argv = ["generate", "--drafter", "./nowhere", "--verifier", "./nowhere", "--prompt", "x", "--router", str(folder)]
    with pytest.raises(SystemExit, match="error: router 'gru' is a gru"):  # before ./nowhere is looked at
        cli.main(argv)
