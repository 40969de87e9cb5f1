"""llama.cpp's own speculative decoding, as a baseline beside specroute's cascades.

Runs the `llama-speculative-simple` tool of the llama.cpp source that the pinned llama-cpp-python
vendors (built by `scripts/build_llamacpp_tools.sh`) on one prompt with the pair's GGUF files, greedy
(`--temp 0`, so its output is the verifier's up to near-ties), and reads back the continuation it
printed and its own timers. Its decode timer starts after the prompt's prefill: a per-token rate with
no prompt in it (specroute's rows include their prompt's prefill; see docs/benchmarks.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

TOOL = "llama-speculative-simple"
TOOLS_DIR = Path.home() / ".cache" / "specroute" / "llamacpp-tools" / "bin"  # where the build script puts it
BUILD_HINT = "build it with `bash scripts/build_llamacpp_tools.sh` (about 5 CPU-minutes)"


@dataclass(frozen=True)
class SpeculativeRun:
    """One prompt decoded by llama.cpp's speculative decoding."""

    text: str  # the continuation it printed (the prompt's echo removed)
    tokens: int  # tokens it decoded (its n_predict)
    seconds: float  # its decode timer: from after the prompt's prefill to the last token
    drafted: int  # draft tokens the verifier checked
    accepted: int  # of those, accepted

    @property
    def tokens_per_block(self) -> float:
        """New tokens per verification (accepted drafts + the verifier's own token, each block)."""
        blocks = self.tokens - self.accepted
        return self.tokens / blocks if blocks > 0 else float(self.tokens)


def find_tool(path: str | os.PathLike | None = None) -> Path:
    """The tool's path: `path`, else $SPECROUTE_LLAMACPP_TOOLS/<tool>, else the build script's
    folder; a clear error naming the fix when none exists."""
    candidates = [Path(path)] if path else []
    if os.environ.get("SPECROUTE_LLAMACPP_TOOLS"):
        candidates.append(Path(os.environ["SPECROUTE_LLAMACPP_TOOLS"]) / TOOL)
    candidates.append(TOOLS_DIR / TOOL)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise SystemExit(f"{TOOL} not found (tried {tried}): {BUILD_HINT}, or pass its path")


def run_speculative(
    tool: Path,
    verifier_gguf: str | os.PathLike,
    drafter_gguf: str | os.PathLike,
    prompt: str,
    max_new_tokens: int,
    draft_max: int = 4,
    threads: int = 1,
    timeout: float = 1800.0,
) -> SpeculativeRun:
    """Decode `prompt` greedily with llama.cpp's speculative decoding (drafts of at most `draft_max`
    tokens, `threads` threads per model) for `max_new_tokens` tokens or until end of text."""
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(prompt + "\n")  # the tool drops one trailing newline of a prompt file
        command = [str(tool), "-m", str(verifier_gguf), "-md", str(drafter_gguf), "-f", str(prompt_file)]
        command += ["-n", str(max_new_tokens), "--temp", "0", "--spec-type", "draft-simple"]
        command += ["--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0"]
        command += ["-t", str(threads), "-tb", str(threads), "-td", str(threads), "-tbd", str(threads)]
        command += ["-c", "4096", "-b", "4096", "-ub", "512"]  # the whole prompt in one batch, as the tool needs
        for _ in range(ATTEMPTS):
            proc = subprocess.run(command, capture_output=True, timeout=timeout)
            # bytes that are not UTF-8 (a token may end inside a character) survive as surrogates:
            # text.encode("utf-8", "surrogateescape") gives back what it printed
            stdout, stderr = (out.decode("utf-8", "surrogateescape") for out in (proc.stdout, proc.stderr))
            if proc.returncode != 0:
                tail = "\n".join(stderr.strip().splitlines()[-6:])
                raise RuntimeError(
                    f"{TOOL} failed (exit {proc.returncode}) on a {len(prompt)}-character prompt:\n{tail}"
                )
            if _DECODED.search(stderr):
                break
    return parse_output(stdout, stderr, prompt)


# the tool logs through a background thread and exits without flushing it, so its last lines (the
# continuation's end and its counts) are now and then lost (seen on models that load and decode in
# milliseconds): a run whose log has no timer line is run again
ATTEMPTS = 3
TRAILER = "\n\n\n\n"  # the tool prints two blank lines after the continuation, then two more after its counts
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds")
_COUNT = re.compile(r"n_(drafted|accept)\s*=\s*(\d+)")


def parse_output(stdout: str, stderr: str, prompt: str) -> SpeculativeRun:
    """The continuation (stdout after the prompt's echo) and the counts and decode timer it logged."""
    decoded = _DECODED.search(stderr) or _DECODED.search(stdout)
    if decoded is None:
        raise RuntimeError(f"{TOOL}: no 'decoded N tokens in S seconds' line in its log; is it the pinned version?")
    counts = {k: int(v) for k, v in _COUNT.findall(stderr + stdout)}
    return SpeculativeRun(
        text=continuation(stdout, prompt),
        tokens=int(decoded.group(1)),
        seconds=float(decoded.group(2)),
        drafted=counts.get("drafted", 0),
        accepted=counts.get("accept", 0),
    )


def continuation(stdout: str, prompt: str) -> str:
    """What follows the prompt's echo in the tool's stdout (the echo is the prompt's tokens printed
    back, so it ends with the prompt's own last characters), without the blank lines it prints last."""
    tail = prompt[-64:]
    at = stdout.find(tail, max(0, len(prompt) - len(tail) - 256))  # the echo, not a repeat in the continuation
    if at < 0:
        raise RuntimeError(f"{TOOL}: its output does not echo the prompt's end {tail[-20:]!r}")
    return stdout[at + len(tail) :].removesuffix(TRAILER)
