#!/usr/bin/env bash
# Stop the dev cluster: cancel its jobs, then end exactly the processes start.sh recorded.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"
[[ -d $S/pids ]] || exit 0

if alive slurmctld; then
  scancel --user="$(id -un)" >/dev/null 2>&1
  for _ in $(seq 20); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
fi
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
  c=${COMPONENTS[$i]}
  pid=$(pid_of "$c") || continue
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$S/pids/$c.pid"
done
echo "devcluster: stopped ($S)" >&2
