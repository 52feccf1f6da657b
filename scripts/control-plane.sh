#!/usr/bin/env bash
# Build the pinned Kubernetes control plane that tests/realkube runs: kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl (k8s.io/kubernetes; kubectl renders and applies deploy/ in tests/kube/test_deploy.py and
# tests/realkube/test_apply_kustomize.py), etcd (go.etcd.io/etcd/server/v3) and kwok (sigs.k8s.io/kwok), from their Go
# modules only (GOPROXY as configured on the machine; nothing else is downloaded, nothing is committed).
#
# The versions are pinned by the go.mod/go.sum files under hack/control-plane/{kube,etcd,kwok}. The binaries go to
#   ${GPU_AUTOSCALER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-autoscaler}/control-plane/<key>/bin
# where <key> is a hash of those files, the Go version and this script's RECIPE; the Go build and module caches live
# beside them (control-plane/go/{build,mod}), so a version bump only recompiles what changed. When the binaries for
# the current key are there, nothing is built.
#
# Usage:
#   scripts/control-plane.sh            build if needed, then print the bin dir on the last line of stdout
#   scripts/control-plane.sh --bin-dir  print the bin dir of the current key; exit 0 if it is complete, 1 if not
#                                       (never builds; used by tests/realkube to find the binaries)
#   scripts/control-plane.sh --force    rebuild even if the cache is current
# Cold build on a 2-core machine (empty cache, kubectl included): ~1,100 CPU-seconds, so ~10 minutes when the machine
# is otherwise idle (measured 23m42s at nice 19 beside other jobs, load ~5); again after a version bump (Go caches
# warm): ~25 s; adding kubectl (recipe 5) over the Go caches of recipe 4: 1m25s; cache current: 0.03 s.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODULES="$ROOT/hack/control-plane"
# Bump when the build recipe below (flags, ldflags, binaries) changes, so the cache key changes with it.
RECIPE="5"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
since() { local s=$(( $(date +%s) - $1 )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

mode=build
case "${1:-}" in
    "") ;;
    --bin-dir) mode=bin-dir ;;
    --force) mode=force ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (try --help)" ;;
esac

command -v go >/dev/null || die "the Go toolchain is not on PATH (this needs Go >= 1.26)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
go_version="$(go env GOVERSION)"
case "$go_version" in
    go1.2[6-9]*|go1.[3-9][0-9]*) ;;
    *) die "$go_version is too old: k8s.io/kubernetes v1.37 needs Go >= 1.26" ;;
esac

CACHE_ROOT="${GPU_AUTOSCALER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-autoscaler}/control-plane"
key="$(
    {
        echo "recipe=$RECIPE go=$go_version $(go env GOOS)/$(go env GOARCH)"
        for m in kube etcd kwok; do cat "$MODULES/$m/go.mod" "$MODULES/$m/go.sum"; done
    } | sha256sum | cut -c1-16
)"
BIN="$CACHE_ROOT/$key/bin"
STAMP="$BIN/.complete"

complete() {
    [[ -f "$STAMP" ]] || return 1
    local b
    for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
    [[ -d "$BIN/kwok-stages" ]]
}

if [[ "$mode" == bin-dir ]]; then
    echo "$BIN"
    complete
    exit
fi

start=$(date +%s)
if [[ "$mode" == build ]] && complete; then
    log "cache current ($key): $(tr '\n' ' ' <"$STAMP")— nothing to build ($(since "$start"))"
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
# One build at a time per cache (two test runs started together wait for each other instead of racing).
exec 9>"$CACHE_ROOT/.lock"
if ! flock -n 9; then
    log "another build holds $CACHE_ROOT/.lock; waiting (at most 60 min)"
    flock -w 3600 9 || die "timed out waiting for $CACHE_ROOT/.lock"
    if [[ "$mode" == build ]] && complete; then
        log "built meanwhile by the other process ($(since "$start"))"
        echo "$BIN"
        exit 0
    fi
fi

export GOCACHE="$CACHE_ROOT/go/build" GOMODCACHE="$CACHE_ROOT/go/mod"
version_of() { (cd "$MODULES/$1" && go list -m -f '{{.Version}}' "$2"); }

log "Go $go_version, $(nproc) cores, GOPROXY=$(go env GOPROXY)"
log "cache key $key -> $BIN"
log "step 1/4: downloading the pinned modules (go mod download)"
t=$(date +%s)
for m in kube etcd kwok; do (cd "$MODULES/$m" && go mod download) || die "go mod download failed in hack/control-plane/$m"; done
K8S_VERSION="$(version_of kube k8s.io/kubernetes)"
ETCD_VERSION="$(version_of etcd go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(version_of kwok sigs.k8s.io/kwok)"
log "  k8s.io/kubernetes $K8S_VERSION, go.etcd.io/etcd/server/v3 $ETCD_VERSION, sigs.k8s.io/kwok $KWOK_VERSION ($(since "$t"))"

tmp="$CACHE_ROOT/$key/bin.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
heartbeat_pid=""
cleanup() {
    [[ -n "$heartbeat_pid" ]] && kill "$heartbeat_pid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# build STEP WHAT MODULE LDFLAGS PACKAGE...: one `go build` per module (its packages share one compile), with a
# progress line every minute so a CI log shows the build is alive.
build() {
    local step="$1" what="$2" module="$3" ldflags="$4"
    shift 4
    log "step $step: building $what (go build -trimpath, CGO_ENABLED=0)"
    local t
    t=$(date +%s)
    (
        exec 9>&-  # not the build lock: it must go with the build
        trap 'kill "$nap" 2>/dev/null; exit 0' TERM
        while :; do
            sleep 60 &
            nap=$!
            wait "$nap"
            log "  ... still building $what ($(since "$t"))"
        done
    ) &
    heartbeat_pid=$!
    (cd "$MODULES/$module" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" "$@") || die "go build of $what failed"
    kill "$heartbeat_pid" 2>/dev/null || true
    wait "$heartbeat_pid" 2>/dev/null || true
    heartbeat_pid=""
    log "  built $what ($(since "$t"))"
}

k8s_minor="${K8S_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
kv="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
kv="$kv -X k8s.io/component-base/version.gitMinor=$k8s_minor -X k8s.io/component-base/version.gitTreeState=clean"
kv="$kv -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1"
kv="$kv -X k8s.io/client-go/pkg/version.gitMinor=$k8s_minor"
build 2/4 "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION (the long one)" kube \
    "-s -w $kv" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
build 3/4 "etcd $ETCD_VERSION" etcd "-s -w" go.etcd.io/etcd/server/v3
mv "$tmp/server" "$tmp/etcd"  # go names a .../server/v3 main package "server"
build 4/4 "kwok $KWOK_VERSION" kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok

# kwok run on its own (not through kwokctl) needs its Stage definitions: take those of the pinned module.
kwok_dir="$(cd "$MODULES/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
mkdir -p "$tmp/kwok-stages"
for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    cp "$kwok_dir/kustomize/stage/$f.yaml" "$tmp/kwok-stages/" || die "kwok stage $f.yaml missing in $kwok_dir"
done
chmod -R u+w "$tmp/kwok-stages"  # the module cache is read-only

for b in "${BINARIES[@]}"; do [[ -x "$tmp/$b" ]] || die "$b missing after the build"; done
"$tmp/kube-apiserver" --version >&2
"$tmp/kubectl" version --client >&2
"$tmp/etcd" --version | sed -n 1p >&2
"$tmp/kwok" --version >&2
printf 'kubernetes=%s\netcd=%s\nkwok=%s\ngo=%s\n' "$K8S_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$go_version" \
    >"$tmp/.complete"
rm -rf "$BIN"
mv "$tmp" "$BIN"
in_use() {
    local exe
    for exe in /proc/[0-9]*/exe; do
        [[ "$(readlink "$exe" 2>/dev/null)" == "$1"/* ]] && return 0
    done
    return 1
}
# Binaries of other keys (older pins) are ~380 MB each and never used again: drop them (the Go caches stay).
for old in "$CACHE_ROOT"/*/; do
    old="${old%/}"
    [[ "$old" == "$CACHE_ROOT/go" || "$old" == "$CACHE_ROOT/$key" ]] && continue
    # Not while a process (another test session's control plane) still runs one of them.
    if [[ -d "$old/bin" ]] && in_use "$old/bin"; then
        log "keeping the binaries of an older pin, still running: $old (removed by a later build)"
        continue
    fi
    log "removing the binaries of an older pin: $old"
    rm -rf "$old"
done
log "done in $(since "$start"): $(du -sh "$BIN" | cut -f1) of binaries in $BIN; Go caches $(du -sh "$CACHE_ROOT/go" | cut -f1)"
echo "$BIN"
