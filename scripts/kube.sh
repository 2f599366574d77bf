#!/usr/bin/env bash
# A real Kubernetes API server for the remediator: kube-apiserver built from the Go module
# k8s.io/kubernetes, on Debian's etcd, on loopback, with RBAC. No kubelet, scheduler or
# controller-manager runs: nodes and pods are objects the tests create.
#
#   kube.sh install   etcd from Debian; kube-apiserver + kubectl built once, cached (~4 min cold)
#   kube.sh start     start etcd and the apiserver if not running, wait until ready, apply RBAC
#   kube.sh stop | status
#
# Two kubeconfigs under $GPUHEALTH_RUN/kube: admin.kubeconfig (system:masters, for setting up
# tests) and remediator.kubeconfig (user gpuhealth-remediator, bound by
# deploy/kubernetes/remediator-rbac.yaml and narrowed by remediator-admission.yaml, and by nothing else).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=env.sh
source "$here/env.sh"
me=kube
# shellcheck source=lib.sh
source "$here/lib.sh"

build=$GPUHEALTH_CACHE/kube-$GPUHEALTH_KUBE_VERSION
bin=$build/bin
run=$GPUHEALTH_RUN/kube
api=https://127.0.0.1:$GPUHEALTH_KUBE_PORT
export GOMODCACHE=$build/gomod GOPATH=$build/gopath GOCACHE=$build/gocache GOFLAGS=-mod=mod
export PATH=/usr/local/go/bin:$PATH

install() {
  # One install at a time (make up and make test may both ask): the second waits, then finds it built.
  # In a subshell, so the lock is not inherited by the servers started afterwards.
  mkdir -p "$GPUHEALTH_CACHE"
  ( flock 9; build ) 9>"$GPUHEALTH_CACHE/kube-install.lock"
}

build() {
  if ! command -v etcd >/dev/null; then
    log "apt-get install etcd-server etcd-client"
    apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null
  fi
  [[ -x $bin/kube-apiserver && -x $bin/kubectl ]] && return 0
  command -v go >/dev/null || die "Go is needed to build kube-apiserver"
  log "building kube-apiserver $GPUHEALTH_KUBE_VERSION from its Go module (once; cached in $build)"
  local staging=v0.${GPUHEALTH_KUBE_VERSION#v1.} minor dir flags
  minor=${GPUHEALTH_KUBE_VERSION#v1.}; minor=${minor%%.*}
  mkdir -p "$build"
  dir=$(cd "$build" && go mod download -json "k8s.io/kubernetes@$GPUHEALTH_KUBE_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$build/src" && cp -r "$dir" "$build/src" && chmod -R u+w "$build/src"
  cd "$build/src"
  # The module zip has no staging/ (nested modules) and no vendor/: the replaces point at the
  # published k8s.io/* modules of the same release instead.
  rm -rf go.work go.work.sum vendor
  sed -i -E "s#^(\s*)(k8s\.io/[a-z-]+) => \./staging/src/k8s\.io/[a-z-]+#\1\2 => \2 $staging#" go.mod
  sed -i '/k8s.io\/sample-cli-plugin => /d' go.mod
  nice -n 19 go mod download
  flags="-s -w -X k8s.io/component-base/version.gitVersion=$GPUHEALTH_KUBE_VERSION"
  flags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  mkdir -p "$bin.tmp"
  nice -n 19 go build -trimpath -ldflags "$flags" -o "$bin.tmp/kube-apiserver" ./cmd/kube-apiserver
  nice -n 19 go build -trimpath -ldflags "$flags" -o "$bin.tmp/kubectl" ./cmd/kubectl
  rm -rf "$bin" && mv "$bin.tmp" "$bin"
  rm -rf "$build/src" "$build/gocache"      # 3 GB of build cache: the binaries are what is kept
  log "built $("$bin/kube-apiserver" --version)"
}

ready() { [[ $(curl -sk -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $(admin_token)" "$api/readyz") == 200 ]]; }
admin_token() { cut -d, -f1 "$run/pki/tokens.csv" | head -n1; }

kubeconfig() { # kubeconfig FILE USER TOKEN
  "$bin/kubectl" --kubeconfig="$1" config set-cluster local --server="$api" \
    --certificate-authority="$run/certs/apiserver.crt" --embed-certs=true >/dev/null
  "$bin/kubectl" --kubeconfig="$1" config set-credentials "$2" --token="$3" >/dev/null
  "$bin/kubectl" --kubeconfig="$1" config set-context local --cluster=local --user="$2" >/dev/null
  "$bin/kubectl" --kubeconfig="$1" config use-context local >/dev/null
  chmod 0600 "$1"
}

start() {
  install
  if alive "$run/apiserver.pid" && ready; then log "already running ($api)"; return 0; fi
  stop >/dev/null 2>&1 || true
  mkdir -p "$run/pki" "$run/certs"
  [[ -s $run/pki/sa.key ]] || {
    openssl genrsa -out "$run/pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$run/pki/sa.key" -pubout -out "$run/pki/sa.pub" 2>/dev/null
  }
  # One token per login, made once: the admin (tests' set-up) and the remediator (RBAC-bound).
  [[ -s $run/pki/tokens.csv ]] || printf '%s,admin,admin,system:masters\n%s,gpuhealth-remediator,gpuhealth-remediator\n' \
    "$(openssl rand -hex 24)" "$(openssl rand -hex 24)" >"$run/pki/tokens.csv"
  chmod 0600 "$run/pki/tokens.csv"
  # Fresh etcd data each start: nodes, pods and RBAC are the tests' and this script's to create.
  rm -rf "$run/etcd-data"
  setsid nohup etcd --name gpuhealth --data-dir "$run/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$GPUHEALTH_ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$GPUHEALTH_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((GPUHEALTH_ETCD_PORT + 10))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((GPUHEALTH_ETCD_PORT + 10))" \
    --initial-cluster "gpuhealth=http://127.0.0.1:$((GPUHEALTH_ETCD_PORT + 10))" \
    >"$run/etcd.log" 2>&1 </dev/null &
  echo $! >"$run/etcd.pid"
  setsid nohup "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$GPUHEALTH_ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$GPUHEALTH_KUBE_PORT" \
    --cert-dir="$run/certs" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$run/pki/sa.pub" --service-account-signing-key-file="$run/pki/sa.key" \
    --token-auth-file="$run/pki/tokens.csv" --authorization-mode=RBAC \
    --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --enable-admission-plugins=ValidatingAdmissionPolicy \
    --disable-admission-plugins=ServiceAccount >"$run/apiserver.log" 2>&1 </dev/null &
  echo $! >"$run/apiserver.pid"
  local i
  for i in $(seq 1 240); do
    ready && break
    alive "$run/apiserver.pid" || { tail -n 20 "$run/apiserver.log" >&2; die "kube-apiserver exited"; }
    sleep 0.5
  done
  ready || { tail -n 20 "$run/apiserver.log" >&2; die "kube-apiserver not ready after 120 s"; }
  # The serving certificate is self-signed by the apiserver at first start; clients trust exactly it.
  kubeconfig "$run/admin.kubeconfig" admin "$(admin_token)"
  kubeconfig "$run/remediator.kubeconfig" gpuhealth-remediator "$(sed -n 2p "$run/pki/tokens.csv" | cut -d, -f1)"
  # The remediator's role, then the admission policies that narrow it (ValidatingAdmissionPolicy: GA in
  # 1.30, its API and admission plugin on by default)
  local manifest
  for manifest in remediator-rbac.yaml remediator-admission.yaml; do
    if [[ -f $root/deploy/kubernetes/$manifest ]]; then
      "$bin/kubectl" --kubeconfig="$run/admin.kubeconfig" apply -f "$root/deploy/kubernetes/$manifest" >/dev/null
    fi
  done
  log "kube-apiserver $GPUHEALTH_KUBE_VERSION is up ($api; KUBECONFIG=$run/admin.kubeconfig)"
}

stop() {
  stop_pidfile "$run/apiserver.pid" "$run/etcd.pid"
  log "stopped"
}

status() {
  if alive "$run/apiserver.pid" && ready; then echo "kube      up   $api (KUBECONFIG=$run/admin.kubeconfig)"; else echo "kube      down"; return 3; fi
}

case ${1:-status} in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) die "usage: kube.sh install|start|stop|status" ;;
esac
