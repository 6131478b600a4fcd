"""Prompts at scale from what is already on a machine with no network.

Sources (every prompt is a dict {"name", "category", "text", "chat"}; ``chat`` prompts are an
instruction the generation stage wraps in SmolLM2's chat template, the others are raw text the
target continues):

- ``chat``: templated instructions (``chat_instructions.py``), a few thousand, and questions
  SmolLM2 wrote itself (``self_instruct.py``).
- ``code``: raw Python to continue, cut from the functions of the Python source files on the
  machine (standard library and installed packages): module imports + signature + docstring
  (or the first lines of the body); plus HumanEval's prompts when its file is given.
- ``code_chat``: "explain / refactor / test / review this function" around a function's source.
- ``prose``: docstrings long enough to be prose: the first part to continue raw, or the whole
  one to summarise or explain (chat).

Held out (``is_heldout``): a prompt whose name hashes to 0 mod ``HELDOUT_MOD``, plus the
questions of the GPU test prompts (tests/prompts_gpu.py). The rule looks at the name only
(file path relative to its root + qualified function name, or the instruction text), so the
device's and this machine's Python versions hold out the same functions wherever both have them.
"""
from __future__ import annotations

import ast
import hashlib
import os
import random
import site
import sys
import sysconfig
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from training.chat_instructions import all_instructions
from training.self_instruct import load_questions

CATEGORIES = ("chat", "code", "code_chat", "prose")
HELDOUT_MOD = 40
MAX_FILE_BYTES = 200_000
MAX_PER_FILE = 8          # functions and docstrings taken from one file (spread over many files)
MIN_FUNC_LINES, MAX_FUNC_LINES = 4, 60
MIN_PROSE_CHARS = 300

CODE_CHAT_TEMPLATES = [
    "Explain what this Python function does:\n\n```python\n{src}\n```",
    "Refactor this Python function to make it easier to read, and explain your changes.\n\n"
    "```python\n{src}\n```",
    "Write pytest unit tests for this function:\n\n```python\n{src}\n```",
    "Review this code and point out possible bugs or edge cases:\n\n```python\n{src}\n```",
    "Add type hints and a docstring to this function:\n\n```python\n{src}\n```",
    "Describe step by step what happens when this function runs:\n\n```python\n{src}\n```",
]
PROSE_CHAT_TEMPLATES = [
    "Summarize the following documentation in plain English:\n\n{doc}",
    "Explain this to a beginner:\n\n{doc}",
    "What are the key points of this text?\n\n{doc}",
    "Rewrite this paragraph so that it is shorter and clearer:\n\n{doc}",
]


def stable_hash(name: str) -> int:
    return int(hashlib.sha1(name.encode()).hexdigest()[:12], 16)


def _gpu_test_questions() -> set[str]:
    try:
        from tests.prompts_gpu import _QUESTIONS
    except ImportError:  # a copy of training/ without tests/
        return set()
    return set(_QUESTIONS)


_ALWAYS_HELDOUT = _gpu_test_questions()


def is_heldout(name: str) -> bool:
    return stable_hash(name) % HELDOUT_MOD == 0 or name.removeprefix("chat/") in _ALWAYS_HELDOUT


def source_roots() -> list[tuple[str, Path]]:
    """(label, directory) of the standard library and every site-packages on sys.path."""
    roots = [("stdlib", Path(sysconfig.get_paths()["stdlib"]))]
    seen = {roots[0][1].resolve()}
    candidates = list(site.getsitepackages()) + [p for p in sys.path if p]
    candidates += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    for path in candidates:
        p = Path(path)
        # A site root inside another (a package dir on sys.path) would name its files twice.
        nested = any(r in p.resolve().parents or p.resolve() in r.parents
                     for _, r in roots[1:])
        if ("site-packages" in p.parts or "dist-packages" in p.parts or p.name == "site") \
                and p.is_dir() and p.resolve() not in seen and not nested:
            seen.add(p.resolve())
            roots.append(("site", p.resolve()))
    return roots


def list_python_files(max_files: int, seed: int = 0) -> list[tuple[str, str]]:
    """Up to ``max_files`` (name, path) pairs, a seeded sample of every root's .py files."""
    files = []
    for label, root in source_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            # The stdlib's own site-packages is walked as a "site" root: one name per file,
            # or a file could be held out under one name and trained on under the other.
            skip = {"__pycache__", "site-packages", "dist-packages"} if label == "stdlib" \
                else {"__pycache__"}
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in skip)
            for f in sorted(filenames):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    files.append((f"{label}:{os.path.relpath(path, root)}", path))
    files = sorted(dict(files).items())
    random.Random(seed).shuffle(files)
    return files[:max_files]


def _docstring_text(node) -> str | None:
    doc = ast.get_docstring(node, clean=True)
    if not doc or len(doc) < MIN_PROSE_CHARS or "license" in doc[:400].lower() \
            or "copyright" in doc[:400].lower():
        return None  # licence headers are the same text everywhere: no prose worth learning
    return doc


def prompts_from_file(item: tuple[str, str]) -> list[dict]:
    """Code, code_chat and prose prompts from one Python file (none if it does not parse)."""
    name, path = item
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return []
        source = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
        return []
    lines = source.splitlines()
    imports = [ln for ln in lines[:200] if ln.startswith(("import ", "from "))][:8]
    header = "\n".join(imports) + ("\n\n\n" if imports else "")
    out = []
    module_doc = _docstring_text(tree)
    if module_doc:
        out += _prose_prompts(f"{name}:<module>", module_doc)
    funcs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n_lines = node.end_lineno - node.lineno + 1
            if MIN_FUNC_LINES <= n_lines <= MAX_FUNC_LINES:
                funcs.append(node)
    rng = random.Random(stable_hash(name))
    rng.shuffle(funcs)
    for node in funcs[:MAX_PER_FILE]:
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        body = lines[start:node.end_lineno]
        indent = len(body[0]) - len(body[0].lstrip())
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in body]
        src = "\n".join(body)
        fname = f"{name}:{node.name}@{node.lineno}"
        # Raw continuation: cut after the docstring, or after a third of the body.
        first_stmt = node.body[0]
        has_doc = isinstance(first_stmt, ast.Expr) and isinstance(
            getattr(first_stmt, "value", None), ast.Constant) and isinstance(first_stmt.value.value, str)
        cut = (first_stmt.end_lineno if has_doc else node.body[0].lineno
               + max(0, (node.end_lineno - node.body[0].lineno) // 3)) - start
        out.append({"name": f"code/{fname}", "category": "code", "chat": False,
                    "text": header + "\n".join(body[:max(cut, 1)]) + "\n"})
        tpl = CODE_CHAT_TEMPLATES[stable_hash(fname) % len(CODE_CHAT_TEMPLATES)]
        out.append({"name": f"code_chat/{fname}", "category": "code_chat", "chat": True,
                    "text": tpl.format(src=src)})
        doc = _docstring_text(node)
        if doc:
            out += _prose_prompts(fname, doc)
    return out[: 3 * MAX_PER_FILE]


def _prose_prompts(name: str, doc: str) -> list[dict]:
    doc = doc[:2000]
    words = doc.split(" ")
    cut = " ".join(words[: max(8, len(words) // 3)])
    tpl = PROSE_CHAT_TEMPLATES[stable_hash(name) % len(PROSE_CHAT_TEMPLATES)]
    return [{"name": f"prose/{name}", "category": "prose", "chat": False, "text": cut},
            {"name": f"prose_chat/{name}", "category": "prose", "chat": True,
             "text": tpl.format(doc=doc)}]


def chat_prompts() -> list[dict]:
    """The templated instructions, then the questions SmolLM2 wrote (``self_instruct.py``)."""
    questions = list(dict.fromkeys(all_instructions() + load_questions()))
    return [{"name": f"chat/{q}", "category": "chat", "chat": True, "text": q} for q in questions]


def humaneval_prompts(path: Path | None) -> list[dict]:
    if path is None or not Path(path).exists():
        return []
    from training.prompts import humaneval_prompts as read

    return [{"name": f"humaneval/{task}", "category": "code", "chat": False, "text": text}
            for task, text in read(Path(path))]


def build_all(max_files: int, humaneval: Path | None = None, workers: int = 1,
              budget_s: float = 60.0, seed: int = 0, log=print) -> list[dict]:
    """Every prompt from every source, de-duplicated by name, in a fixed seeded order."""
    t0 = time.time()
    files = list_python_files(max_files, seed)
    log(f"prompt sources: {len(files)} python files sampled, {time.time() - t0:.1f}s")
    from_files = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for chunk in pool.map(prompts_from_file, files, chunksize=64):
                from_files += chunk
                if time.time() - t0 > budget_s:
                    log("prompt sources: time budget reached, files left unread")
                    pool.shutdown(wait=False, cancel_futures=True)
                    break
    else:
        for item in files:
            from_files += prompts_from_file(item)
            if time.time() - t0 > budget_s:
                break
    prompts = chat_prompts() + humaneval_prompts(humaneval) + from_files
    prompts = list({p["name"]: p for p in prompts}.values())
    random.Random(seed).shuffle(prompts)
    counts = {c: sum(p["category"] == c for p in prompts) for c in CATEGORIES}
    log(f"prompt sources: {len(prompts)} prompts {counts} in {time.time() - t0:.1f}s")
    return prompts
