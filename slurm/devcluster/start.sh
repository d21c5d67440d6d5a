#!/usr/bin/env bash
# Start a throw-away SLURM 22.05 cluster on this machine: munge, MariaDB + slurmdbd (so sacct
# works), slurmctld, and two compute nodes n1, n2 (one slurmd each, in private mount and UTS
# namespaces whose /etc/hosts resolves n1 and n2 to 127.0.0.1). Everything lives under one state
# directory ($HPCGNN_DEVCLUSTER_DIR, default /tmp/hpcgnn-devcluster); PIDs go to $S/pids.
# Running it again while the cluster is up does nothing. Clients need SLURM_CONF:
#   eval "$(slurm/devcluster/start.sh)"    # prints: export SLURM_CONF=...
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

all_up() { local c; for c in "${COMPONENTS[@]}"; do alive "$c" || return 1; done; }
if [[ -d $S/pids ]] && all_up; then
  echo "devcluster: already running in $S" >&2
  echo "export SLURM_CONF=$SLURM_CONF"
  exit 0
fi
for bin in munged mariadbd slurmdbd slurmctld slurmd sbatch sacct; do
  command -v "$bin" >/dev/null || { echo "devcluster: $bin missing: run $HERE/install.sh first" >&2; exit 1; }
done
"$HERE/stop.sh" >/dev/null 2>&1 || true   # a half-started cluster: clear it first

mkdir -p "$S"/{etc,pids,log,run,munge,ctld,spool,mysql}
chmod 755 "$S" "$S/munge"   # munged wants its socket's parent directories world-executable, not writable
rm -rf "$S/ctld"/* "$S/spool"/*  # no job state survives a rebuild

# munge: a key of our own.
[[ -f $S/munge/munge.key ]] || { head -c 1024 /dev/urandom >"$S/munge/munge.key"; chmod 400 "$S/munge/munge.key"; }
MUNGE_SOCKET=$S/munge/munge.socket.2
launch munged munged --foreground --force --key-file="$S/munge/munge.key" --socket="$MUNGE_SOCKET" \
  --pid-file="$S/run/munged.pid" --log-file="$S/log/munged.log" --seed-file="$S/munge/munged.seed"
wait_for 20 munged test -S "$MUNGE_SOCKET"

# MariaDB for slurmdbd, on 127.0.0.1:$DB_PORT only.
if [[ ! -d $S/mysql/data/mysql ]]; then
  mariadb-install-db --no-defaults --datadir="$S/mysql/data" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$S/log/mariadb-install.log" 2>&1
fi
launch mariadbd mariadbd --no-defaults --datadir="$S/mysql/data" --socket="$S/mysql/mysqld.sock" \
  --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$S/run/mariadbd.pid" \
  --user=root --log-error="$S/log/mariadb.log" --innodb-buffer-pool-size=32M
wait_for 60 mariadbd mariadb-admin --no-defaults --socket="$S/mysql/mysqld.sock" ping
mariadb --no-defaults --socket="$S/mysql/mysqld.sock" -e "
  CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

HOST=$(hostname -s)
# A fresh first job id on every rebuild: submitit must never find an old job's result pickle.
FIRST_JOB_ID=$(( $(date +%s) % 50000000 + 1000000 ))
cat >"$S/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$S/run/slurmdbd.pid
LogFile=$S/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
chmod 600 "$S/etc/slurmdbd.conf"

{
  cat <<CONF
ClusterName=devcluster
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=2,bf_interval=2
MailProg=/bin/true
MpiDefault=none
ReturnToService=2
FirstJobId=$FIRST_JOB_ID
MinJobAge=600
KillWait=5
Waittime=0
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none
CONF
  i=1
  for n in "${NODES[@]}"; do
    echo "NodeName=$n NodeAddr=127.0.0.1 Port=$((NODE_PORT_BASE + i)) CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB State=UNKNOWN"
    i=$((i + 1))
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
} >"$S/etc/slurm.conf"

# What jobs see as /etc/hosts: the node names resolve to loopback.
printf '127.0.0.1 localhost %s %s\n::1 localhost\n' "${NODES[*]}" "$HOST" >"$S/etc/hosts"

launch slurmdbd slurmdbd -D
wait_for 60 slurmdbd sacctmgr -n list cluster
sacctmgr -i add cluster devcluster >/dev/null 2>&1 || true

launch slurmctld slurmctld -D -i
wait_for 60 slurmctld scontrol ping
for n in "${NODES[@]}"; do
  launch "slurmd-$n" unshare --mount --uts --propagation private \
    bash -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -D -N "$2"' _ "$S/etc/hosts" "$n"
done
nodes_idle() { [[ $(sinfo -h -N -o '%N %t' | grep -cE ' (idle|mix|alloc)$') -eq ${#NODES[@]} ]]; }
if ! wait_for 60 "nodes ${NODES[*]}" nodes_idle; then
  sinfo -N >&2 || true
  exit 1
fi
echo "export SLURM_CONF=$SLURM_CONF" >"$S/env.sh"
echo "devcluster: up in $S (nodes ${NODES[*]}, first job id $FIRST_JOB_ID)" >&2
echo "export SLURM_CONF=$SLURM_CONF"
