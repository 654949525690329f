#!/usr/bin/env bash
# `make test`: the whole suite as two pytest sessions side by side, the engine's tests
# (tests/rl_core, tests/multinode, tests/test_stdlib_platform.py) and the platform's (tests/platform).
#
# Why two: most of the suite's time is spent waiting (runs starting their role processes, the
# platform's services, Ray nodes, a browser), not computing, so two sessions on a 2-core machine take
# about the longer half's time instead of the sum (~25 instead of ~48 minutes in CI). The halves share
# nothing a test owns: each session starts its own PostgreSQL/Redis, picks free ports, and the
# network-namespace clusters are named and addressed per process (tests/multinode/netns_cluster.py).
#
# The engine half prints as it goes; the platform half writes var/logs/test-platform.log, printed
# whole when it ends, so each session's summary (FAILED lines, slowest tests) reads in one piece.
# PYTEST_ARGS are given to both (e.g. `-k name`; a half where nothing matches is not a failure).
# TEST_HALVES=0 runs one plain `pytest tests` session instead.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
read -r -a extra <<< "${PYTEST_ARGS:-}"
common=(--durations=25 "${extra[@]}")

# pytest's exit code 5 is "no tests collected" (a filter that matched nothing here): not a failure.
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }

if [ "${TEST_HALVES:-1}" = "0" ]; then
  "$PY" -m pytest tests "${common[@]}"
  rc=$?
  ok "$rc" && exit 0
  exit "$rc"
fi

mkdir -p var/logs
platform_log=var/logs/test-platform.log
"$PY" -m pytest tests/platform "${common[@]}" > "$platform_log" 2>&1 &
platform_pid=$!
# Ctrl-C or CI's timeout stops both halves, not only the one in the foreground.
trap 'kill -INT "$platform_pid" 2>/dev/null' INT TERM

echo "make test: the platform half runs alongside (its output: $platform_log, printed when it ends)"
"$PY" -m pytest tests/rl_core tests/multinode tests/test_stdlib_platform.py "${common[@]}"
engine_rc=$?
wait "$platform_pid"
platform_rc=$?

echo
echo "================ the platform half (tests/platform), from $platform_log ================"
cat "$platform_log"
echo
echo "make test: engine half exit $engine_rc, platform half exit $platform_rc"
if ok "$engine_rc" && ok "$platform_rc"; then
  exit 0
fi
ok "$engine_rc" && exit "$platform_rc"
exit "$engine_rc"
