# Shared by start.sh, stop.sh and status.sh: where the dev cluster lives and how to reach it.
# Override with HPCGNN_DEVCLUSTER_DIR (state directory) and HPCGNN_DEVCLUSTER_PORT_BASE.
S=${HPCGNN_DEVCLUSTER_DIR:-/tmp/hpcgnn-devcluster}
PORT_BASE=${HPCGNN_DEVCLUSTER_PORT_BASE:-16800}
DB_PORT=$((PORT_BASE + 6))      # MariaDB, 127.0.0.1 only
CTLD_PORT=$((PORT_BASE + 17))   # slurmctld
DBD_PORT=$((PORT_BASE + 19))    # slurmdbd
NODE_PORT_BASE=$((PORT_BASE + 20))  # slurmd of node i listens on NODE_PORT_BASE + i
NODES=(n1 n2)
CPUS_PER_NODE=${HPCGNN_DEVCLUSTER_CPUS:-4}   # advertised per node (config_overrides: may exceed real cores)
MEM_PER_NODE_MB=${HPCGNN_DEVCLUSTER_MEM_MB:-8000}
# Start order; stop goes backwards.
COMPONENTS=(munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}")
export SLURM_CONF=$S/etc/slurm.conf

pid_of() { cat "$S/pids/$1.pid" 2>/dev/null; }
alive() { local pid; pid=$(pid_of "$1") && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

# Start a foreground daemon in its own session, log to $S/log/NAME.out, record its PID.
launch() {
  local name=$1; shift
  setsid "$@" >"$S/log/$name.out" 2>&1 </dev/null &
  echo $! >"$S/pids/$name.pid"
}

# wait_for SECONDS WHAT CMD...: retry CMD every half second.
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      echo "devcluster: $what did not come up within ${limit}s; logs in $S/log" >&2
      return 1
    fi
    sleep 0.5
  done
}
