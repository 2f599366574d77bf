#!/usr/bin/env bash
# Real Slurm daemons for the remediator: Debian's munge, slurmctld and one slurmd per node of
# `make up`'s mock fleet (gpu-node-00..03, each `slurmd -N NAME` on its own port, 8 GRES GPUs
# backed by device nodes of our own), on loopback, without systemd.
#
#   slurm.sh install | start | stop | status
#
# Clients: SLURM_CONF=$GPUHEALTH_SLURM_DIR/etc/slurm.conf (scontrol, sinfo, sbatch; see env.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
me=slurm
# shellcheck source=lib.sh
source "$here/lib.sh"

dir=$GPUHEALTH_SLURM_DIR
export SLURM_CONF=$dir/etc/slurm.conf
nodes=(gpu-node-00 gpu-node-01 gpu-node-02 gpu-node-03)

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null &&
    command -v scontrol >/dev/null && return 0
  log "apt-get install slurmctld slurmd slurm-client munge"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
}

configure() {
  mkdir -p "$dir"/{etc,state,log,run,tmp,dev,spool,munge}
  chmod 0755 "$dir/munge"   # munged's socket folder must be searchable by every client
  [[ -s $dir/munge/munge.key ]] || mungekey --create --keyfile="$dir/munge/munge.key"
  chmod 0600 "$dir/munge/munge.key"
  # gres/gpu needs device files (a count alone makes the node INVAL+DRAIN): character devices of our own
  local i n
  for i in 0 1 2 3 4 5 6 7; do [[ -e $dir/dev/nvidia$i ]] || mknod "$dir/dev/nvidia$i" c 195 "$i"; done
  for n in "${nodes[@]}"; do mkdir -p "$dir/spool/$n"; done
  {
    cat <<CONF
ClusterName=gpuhealth
SlurmctldHost=localhost
SlurmctldPort=$GPUHEALTH_SLURMCTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=30
MailProg=/bin/true
TmpFS=$dir/tmp
GresTypes=gpu
CONF
    for i in "${!nodes[@]}"; do
      echo "NodeName=${nodes[$i]} NodeAddr=127.0.0.1 Port=$((GPUHEALTH_SLURMD_BASE_PORT + i)) CPUs=64 RealMemory=512000 Gres=gpu:8 State=UNKNOWN"
    done
    echo "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$SLURM_CONF"
  printf 'AutoDetect=off\nNodeName=gpu-node-[00-03] Name=gpu File=%s/dev/nvidia[0-7]\n' "$dir" >"$dir/etc/gres.conf"
}

all_idle() { [[ $(sinfo -h -N -o '%t' 2>/dev/null | sort -u) == idle ]]; }

start() {
  install
  if alive "$dir/run/slurmctld.pid" && scontrol ping >/dev/null 2>&1; then log "already running"; return 0; fi
  stop >/dev/null 2>&1 || true
  configure
  rm -rf "${dir:?}/state"/*   # no drain or job survives from an earlier run
  alive "$dir/munge/munged.pid" || munged --socket="$dir/munge/munge.socket.2" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
  slurmctld -i -f "$SLURM_CONF"
  local i n
  for i in $(seq 1 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
  scontrol ping >/dev/null 2>&1 || { tail -n 20 "$dir/log/slurmctld.log" >&2; die "slurmctld did not answer"; }
  for n in "${nodes[@]}"; do slurmd -N "$n" -f "$SLURM_CONF"; done
  for i in $(seq 1 150); do all_idle && break; sleep 0.2; done
  all_idle || { sinfo -N -o '%N %t %E' >&2; die "nodes are not idle"; }
  log "slurmctld + ${#nodes[@]} slurmd are up (SLURM_CONF=$SLURM_CONF)"
}

stop() {
  if alive "$dir/run/slurmctld.pid"; then
    local ids; ids=$(squeue -h -o %i 2>/dev/null || true)
    # shellcheck disable=SC2086  # job ids are words
    [[ -z $ids ]] || scancel $ids || true
  fi
  stop_pidfile "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/munge/munged.pid"
  log "stopped"
}

status() {
  if alive "$dir/run/slurmctld.pid" && scontrol ping >/dev/null 2>&1; then
    echo "slurm     up   slurmctld 127.0.0.1:$GPUHEALTH_SLURMCTLD_PORT, $(sinfo -h -N -o %N | wc -l) nodes (SLURM_CONF=$SLURM_CONF)"
  else
    echo "slurm     down"; return 3
  fi
}

case ${1:-status} in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) die "usage: slurm.sh install|start|stop|status" ;;
esac
