# Sourced by the native stack's scripts after env.sh: how they speak and stop what they started.
# Each sets `me` (the prefix of its messages) before sourcing this.
log() { echo "${me:-gpu-health}: $*" >&2; }
die() { log "$*"; exit 1; }
# alive PIDFILE: the process the file names runs
alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
# stop_pidfile PIDFILE...: SIGTERM each, wait up to 10 s, then SIGKILL; the files are removed
stop_pidfile() {
  local f pid
  for f in "$@"; do
    alive "$f" || { rm -f "$f"; continue; }
    pid=$(cat "$f"); kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    rm -f "$f"
  done
}
