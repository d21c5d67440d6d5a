#!/usr/bin/env bash
# Install what the dev cluster needs from Debian (root): SLURM 22.05, munge, slurmdbd, MariaDB.
# Does nothing when everything is there. Services are not started by the packages here.
set -euo pipefail
missing=()
for pair in slurmctld:slurm-wlm slurmd:slurm-wlm munged:munge slurmdbd:slurmdbd mariadbd:mariadb-server; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
((${#missing[@]} == 0)) && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null || true
apt-get install -y -q "${missing[@]}" mariadb-client >/dev/null
# Debian's packages may start their own daemons where a service manager exists; ours use their own state.
