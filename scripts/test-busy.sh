#!/usr/bin/env bash
# The suite on a busy machine: two CPU-bound loops load the cores for the whole run (`make test`
# by default, or the command given), and are ended with it however it exits.
set -uo pipefail
cd "$(dirname "$0")/.."
busy=()
for _ in 1 2; do python3 -c 'while 1: pass' & busy+=($!); done
trap 'kill "${busy[@]}" 2>/dev/null' EXIT
echo "busy loops: ${busy[*]}" >&2
[ $# -gt 0 ] || set -- make test
"$@"
