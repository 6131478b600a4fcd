#!/usr/bin/env bash
# PROJECT-MACHINE ONLY: fits this project's lent GPU machines (no registry, 64 MiB per call,
# 10-minute calls); not a general tool. Elsewhere: pip install . and scripts/run_tests.sh -m gpu.
# One step of a GPU-machine session (after the device kit and SmolLM2 are staged, see
# scripts/devkit_resplit.py and scripts/stage_smollm2.py). Long jobs run detached (setsid) so
# they outlive the 10-minute limit of one device call; later calls wait on them and copy their
# results to $OUT.
# Every device call copies the working tree again, so `start` runs each job from its own copy.
# `vllm serve` (and any structured-output request) there also needs packages the device kit
# lacks (seen 2026-11-25): prometheus-fastapi-instrumentator and lm-format-enforcer (which needs
# interegular). Download them here, once, as the versions vLLM's PyPI install brings
# (`python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl
# prometheus-fastapi-instrumentator==8.1.0 lm-format-enforcer==0.11.3 interegular==0.3.3`; .whl/
# is ignored), carry .whl in one call and run `serve-wheels` there.
#
#   bash scripts/device_session.sh setup                 # install the plugin (builds csrc/)
#   bash scripts/device_session.sh build-start           # the same install, in the background:
#                                                        # run it in the first staging call (it
#                                                        # needs only the image's torch), so the
#                                                        # ~3-minute C++ build overlaps staging
#   bash scripts/device_session.sh build-wait            # wait for it (by pid: session 23 lost
#                                                        # 6 minutes to a pgrep matching itself);
#                                                        # if it then cannot import
#                                                        # specdec_plugin._C, run `setup` (about
#                                                        # 60 s): in session 45 the background
#                                                        # build lost a tracked header, most
#                                                        # likely to a later call's tree copy
#   bash scripts/device_session.sh kernels               # GPU kernel tests (tests/ops, -m gpu)
#   bash scripts/device_session.sh serve-wheels          # install the carried .whl/ (the serving
#                                                        # packages the kit lacks; see above)
#   bash scripts/device_session.sh gpu-tests [PYTEST ARGS] # tests/gpu, -v -rA: each test's name
#                                                        # and every failure's reason reach the log
#                                                        # as they happen (session 48's `-q` log,
#                                                        # cut off by the budget, showed 3 F's and
#                                                        # no names); warns first where the
#                                                        # serving packages are missing
#   bash scripts/device_session.sh start NAME CMD...     # run CMD detached, log in /root/jobs
#   bash scripts/device_session.sh wait NAME SECONDS     # wait for NAME (at most SECONDS), copy
#                                                        # /root/jobs/NAME.* and NAME/ to $OUT
#   bash scripts/device_session.sh cache-save            # the compile caches into $OUT, as parts
#   bash scripts/device_session.sh cache-load            # unpack them once all are carried
#                                                        # (.devkit/compile_cache*/)
# Compile caches across leases (new in session 60; `cache-save` ran in session 61: 393 MB in
# 4 parts, 55 MB; `cache-load` ran in session 62 and unpacked them, but none of their 11 keys
# matched that lease's engines, which differed in method or settings: the cache only helps a
# lease that repeats the engines of the lease that saved it): a cold engine
# start compiles for 60-90 s more than a warm one (sessions 53-60: ours 105-114 s against
# 38-75, native 164-196 against about 100), once per model shape and backend, every lease.
# vLLM keys its torch.compile cache by its config, environment and traced source files, and
# keeps Inductor's and Triton's caches inside it so that it can be copied to another machine
# (compilation/compiler_interface.py, initialize_cache). `cache-save` at the end of a lease
# tars that cache and Triton's default one (kernels compiled before vLLM redirects it) into
# $OUT in parts of at most 15 MiB; keep them here in .devkit/compile_cache/ (ignored), carry
# that folder in a staging call and run `cache-load` there. A changed source file only means
# a new key, compiled afresh; the old entries stay unused.
# Several GPUs (kind nvidia-h200-x2, session 31): start one job per GPU, each job script
# exporting its own CUDA_VISIBLE_DEVICES and VLLM_CACHE_ROOT (two engines compiling into one
# cache at once is untested). Device time is held time, so two jobs side by side cost what one
# costs. They share the host: in session 42 engine starts took 101-177 s instead of 45-135,
# and suffix's host-bound cells spread up to 3x between runs while plain and EAGLE-3 cells
# stayed within about 1% (cause not established); keep the comparisons of one bar in one job.
# `wait` copies a job's files to $OUT; a later command in the same call that empties
# $OUT (session 31's `rm -rf $OUT/A*`) throws them away: tar /root/jobs/NAME into $OUT instead.
# The machine goes back about 30 s after a call ends, and a detached job dies with it: while a
# job runs, make the next call (a `wait`) at once, and do any other work only after its files
# are copied back (session 25 lost a benchmark's files and its queued GPU tests to two minutes
# of editing between calls).
set -uo pipefail
export PYTHONPATH=/root/site PYTHONUNBUFFERED=1
JOBS=/root/jobs
mkdir -p "$JOBS"
step=$1; shift

case "$step" in
setup)
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
    python3 -c "import torch, specdec_plugin, specdec_plugin._C, vllm; print('plugin', specdec_plugin.__file__, 'vllm', vllm.__version__)"
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
    ;;
build-start)
    setsid nohup python3 -m pip install -q --no-deps --no-build-isolation -e . \
        > /root/build.log 2>&1 < /dev/null &
    echo $! > /root/build.pid
    echo "build started (pid $(cat /root/build.pid))"
    ;;
build-wait)
    pid=$(cat /root/build.pid)
    while kill -0 "$pid" 2>/dev/null; do sleep 1; done
    tail -3 /root/build.log
    python3 -c "import torch, specdec_plugin._C, vllm; print('plugin built; vllm', vllm.__version__)"
    ;;
kernels)
    python3 -m pytest -q -m gpu tests/ops -p no:cacheprovider 2>&1 | tail -15
    ;;
serve-wheels)
    ls .whl/*.whl > /dev/null || { echo "no .whl/ here: download the wheels and carry .whl" >&2; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl 2>&1 \
        | grep -v "already exists" | tail -3
    python3 -c "import prometheus_fastapi_instrumentator, lmformatenforcer, interegular; print('serving packages installed')"
    ;;
gpu-tests)
    python3 -c "import prometheus_fastapi_instrumentator, lmformatenforcer" 2>/dev/null \
        || echo "WARNING: serving packages missing (carry .whl, run serve-wheels): the tests that start vllm serve will fail"
    python3 -m pytest -v -rA -m gpu tests/gpu -p no:cacheprovider "$@" 2>&1
    ;;
start)
    name=$1; shift
    rm -rf "$JOBS/$name".*
    # The job runs from its own copy of the tree, first on PYTHONPATH (ahead of the editable
    # install), so the copy every later device call makes of the working tree cannot pull
    # files from under an engine that is starting (seen 2026-11-22: ModuleNotFoundError).
    tree="$JOBS/$name.tree"
    cp -a . "$tree"
    # The parentheses send every command of CMD (not only the last) to the log.
    setsid bash -c "cd $tree && export PYTHONPATH=$tree:\$PYTHONPATH && ( $* ) > $JOBS/$name.log 2>&1; echo \$? > $JOBS/$name.rc" < /dev/null &
    echo "started $name (from $tree)"
    ;;
wait)
    name=$1; limit=$2
    for _ in $(seq 1 "$limit"); do
        [ -f "$JOBS/$name.rc" ] && break
        sleep 1
    done
    if [ -f "$JOBS/$name.rc" ]; then echo "$name finished: rc=$(cat "$JOBS/$name.rc")"; else echo "$name still running"; fi
    cp "$JOBS/$name".* "$OUT"/ 2>/dev/null
    [ -d "$JOBS/$name" ] && cp -r "$JOBS/$name" "$OUT"/
    tail -c 6000 "$JOBS/$name.log"
    ;;
cache-save)
    dirs=()
    for d in .cache/vllm/torch_compile_cache .triton/cache; do
        [ -d "/root/$d" ] && dirs+=("$d")
    done
    [ ${#dirs[@]} -gt 0 ] || { echo "no compile cache on this machine" >&2; exit 1; }
    tar czf /root/compile_cache.tgz -C /root "${dirs[@]}"
    # $OUT takes at most 8 files of 16 MiB: a cache over 7 parts does not come back whole.
    split -b 15M -d -a 2 /root/compile_cache.tgz "$OUT/compile_cache.tgz.part"
    parts=$(ls "$OUT"/compile_cache.tgz.part* | wc -l)
    echo "$parts" > "$OUT/compile_cache.parts"  # cache-load waits for this many
    [ "$parts" -le 7 ] || echo "WARNING: $parts parts; only 8 files come back from \$OUT" >&2
    ls -l "$OUT"/compile_cache.*
    ;;
cache-load)
    # Parts may come over several calls (a call carries at most 64 MiB with the tree), each in
    # its own folder (.devkit/compile_cache, .devkit/compile_cache2, ...): a later call's carry
    # replaces an earlier one's folder of the same name. They gather here until all have come.
    mkdir -p /root/compile_cache_parts
    cp .devkit/compile_cache*/compile_cache.* /root/compile_cache_parts/ 2> /dev/null
    want=$(cat /root/compile_cache_parts/compile_cache.parts 2> /dev/null || echo 0)
    have=$(ls /root/compile_cache_parts/compile_cache.tgz.part* 2> /dev/null | wc -l)
    if [ "$want" -eq 0 ] || [ "$have" -lt "$want" ]; then
        echo "compile cache: $have of ${want:-?} parts here; carry the rest and run cache-load again"
        exit 0
    fi
    cat /root/compile_cache_parts/compile_cache.tgz.part* | tar xzf - -C /root || exit 1
    du -sh /root/.cache/vllm/torch_compile_cache /root/.triton/cache 2> /dev/null || true
    ;;
*)
    echo "unknown step $step" >&2; exit 2
    ;;
esac
