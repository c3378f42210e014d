# test/lib.sh - shared by the test, demo and benchmark scripts under test/ (source it; bash only).
# Installs what the project needs on a Debian bookworm(-compatible) machine, idempotently:
# nothing is installed, and apt-get update is not run, when everything is already there.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GO_TOOLCHAIN=go1.26.8      # fetched from the Go module proxy when no go >= GO_MIN is installed
GO_MIN=1.26                # go.mod says go 1.26
PACKAGES=(qemu-system-x86 rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest
          libibverbs-dev librdmacm-dev iproute2 busybox-static cpio kmod bc procps
          gcc libc6-dev pkg-config ca-certificates curl unzip xz-utils)
# The VM scripts' cache and run dirs (test/vm/rxe-vm.sh's -w); the scripts here keep their logs
# and run dirs under it too. Absolute, and exported so that test/vm/*.sh resolve it the same.
VM_WORK=$(realpath -m "${GOXRC_VM_WORK:-/var/cache/goxrc-vm}")
# As test/vm/rxe-vm.sh demands, but before any script here makes or prunes dirs under it.
[[ $VM_WORK != *[[:space:],:]* ]] || { echo "ERROR: GOXRC_VM_WORK must not contain spaces, commas or colons: $VM_WORK" >&2; exit 1; }
export GOXRC_VM_WORK=$VM_WORK
export GOFLAGS=${GOFLAGS:--buildvcs=false}

say() { printf '==> %s\n' "$*"; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }
need_root() { [[ $(id -u) == 0 ]] || die "run as root (as a user with sudo: sudo $0 $*)"; }

# describe_tree [DOC]: the commit being measured, with any uncommitted change to it (DOC, a
# benchmark doc about to be rewritten, is not a change to the measured code).
describe_tree() {
  local exclude=() changed
  [[ -z ${1:-} || $1 != "$REPO"/* ]] || exclude=(":(exclude)${1#"$REPO"/}")
  changed=$({ git -C "$REPO" diff --name-only HEAD -- . "${exclude[@]}" 2>/dev/null || true; } | tr '\n' ' ')
  echo "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)${changed:+ (with uncommitted changes to: $changed)}"
}

# last_round FILE...: the highest N among files named ....N (a run's round count).
last_round() { ls "$@" 2>/dev/null | sed 's/.*\.//' | sort -n | tail -1; }
# jfield KEY FILE: the number after "KEY": in FILE (one JSON object per line, flat keys).
jfield() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" "$2"; }
# median_range FORMAT: the median, lowest and highest of the numbers on stdin, through
# printf FORMAT (three %f), or n/a when there are none.
median_range() {
  sort -g | awk -v f="$1" '{v[NR]=$1} END {if (NR == 0) print "n/a"; else {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf f "\n", m, v[1], v[NR]}}'
}

source "$REPO/test/apt.sh"
install_packages() { apt_install "${PACKAGES[@]}" || die "apt-get install failed"; }

# version_ge A B: is Go version A (1.26.8, 1.19) >= B?
version_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]; }

go_version() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9.]*\).*/\1/p'; }

# goproxy_url: where to fetch the Go toolchain module: the first proxy URL in GOPROXY (the
# environment's, or else `go env GOPROXY` of an installed go), skipping direct and off;
# https://proxy.golang.org when there is none.
goproxy_url() {
  local list=${GOPROXY:-} g p ps
  if [[ -z $list ]]; then
    for g in "$(command -v go || true)" /usr/local/go/bin/go /usr/lib/go/bin/go; do
      [[ -x $g ]] || continue
      list=$(GOTOOLCHAIN=local "$g" env GOPROXY 2>/dev/null || true)
      [[ -z $list ]] || break
    done
  fi
  IFS=',|' read -ra ps <<< "$list"
  for p in ${ps[@]+"${ps[@]}"}; do
    case $p in ''|direct|off) continue;; esac
    echo "${p%/}"; return
  done
  echo https://proxy.golang.org
}

# ensure_go: put a go >= GO_MIN first in PATH (exported, so test/vm/rxe-vm.sh finds it too).
ensure_go() {
  local g v cand
  for g in "$(command -v go || true)" /usr/local/go/bin/go /usr/lib/go/bin/go; do
    [[ -x $g ]] || continue
    v=$(go_version "$g")
    if version_ge "$v" "$GO_MIN"; then
      export PATH=$(dirname "$g"):$PATH; say "Go: $g (go$v)"; return
    fi
  done
  for g in "$(command -v go || true)" /usr/local/go/bin/go /usr/lib/go/bin/go; do
    [[ -x $g ]] || continue
    v=$(go_version "$g")
    if version_ge "$v" 1.21; then        # go >= 1.21 fetches newer toolchains itself
      export PATH=$(dirname "$g"):$PATH GOTOOLCHAIN=$GO_TOOLCHAIN
      go version >/dev/null || die "GOTOOLCHAIN=$GO_TOOLCHAIN: download through the Go module proxy failed"
      say "Go: $g (go$v) with GOTOOLCHAIN=$GO_TOOLCHAIN"; return
    fi
  done
  cand=$(apt-cache policy golang-go 2>/dev/null | sed -n 's/ *Candidate: \([0-9]*:\)\{0,1\}\([0-9.]*\).*/\2/p')
  if [[ -n $cand ]] && version_ge "$cand" "$GO_MIN"; then
    say "installing Debian's golang-go $cand"
    while_locked apt-get "${APT_WAIT[@]}" install -y --no-install-recommends golang-go >&2 || die "apt-get install golang-go failed"
    export PATH=/usr/lib/go/bin:$PATH; return
  fi
  # Debian bookworm's golang-go is 1.19: too old for this module (go 1.26) and for GOTOOLCHAIN.
  # Fetch the official toolchain module (what GOTOOLCHAIN=go1.26.8 would fetch) from the proxy.
  local arch dir=/usr/local/lib/goxrc-go
  case $(uname -m) in x86_64) arch=amd64;; aarch64) arch=arm64;; *) die "unsupported CPU $(uname -m)";; esac
  local mod=golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch proxy
  g=$dir/$mod/bin/go
  # One install at a time (CI's run and a developer's on a fresh machine): a second one would
  # replace the toolchain (rm -rf, mv) under the go commands of the first. An installed one is
  # only read, with no lock (nothing replaces it then), so a read-only /usr/local/lib serves it.
  local lock=
  [[ -x $g ]] || { mkdir -p "$(dirname "$dir")" && exec {lock}> "$dir.lock" && flock "$lock"; } || die "cannot lock $dir.lock"
  if [[ ! -x $g ]]; then   # again, under the lock: another run may have installed it meanwhile
    proxy=$(goproxy_url)
    say "Debian's golang-go is ${cand:-missing}, older than go$GO_MIN which this module needs:" \
        "fetching $GO_TOOLCHAIN from the Go module proxy $proxy ($mod)"
    # Downloaded and unpacked beside, made executable, then moved into place: an interrupted
    # install never leaves a bin/go that runs with tools that do not. What such an install left
    # beside is removed first (under the lock, no install is using it).
    rm -rf "$dir".tmp.*
    local tmp; tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    curl -fsSL --retry 3 -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/v0.0.1-$GO_TOOLCHAIN.linux-$arch.zip" ||
      { rm -rf "$tmp"; die "cannot download $mod; install go >= $GO_MIN yourself (https://go.dev/dl) and put it in PATH"; }
    unzip -q -o "$tmp/go.zip" -d "$tmp" && rm -f "$tmp/go.zip" || die "cannot unpack $tmp/go.zip"
    chmod -R a+rX "$tmp"; chmod a+x "$tmp/$mod"/bin/* "$tmp/$mod"/pkg/tool/*/*
    mkdir -p "$dir/$(dirname "$mod")" && rm -rf "$dir/$mod" && mv "$tmp/$mod" "$dir/$mod" && rm -rf "$tmp" ||
      die "cannot install $mod into $dir"
  fi
  [[ -z $lock ]] || exec {lock}>&-
  export PATH=$(dirname "$g"):$PATH GOTOOLCHAIN=local
  say "Go: $g ($("$g" env GOVERSION))"
}

# prepare_vm: Debian kernel, initramfs and rxe-setup for test/vm/rxe-vm.sh (cached).
prepare_vm() { "$REPO/test/vm/rxe-vm.sh" --prepare || die "test/vm/rxe-vm.sh --prepare failed"; }

# run_vm COMMAND...: COMMAND (test/vm/rxe-vm.sh or rxe-pair.sh: guests that run for minutes) and
# its exit status, as in the foreground; but INT, TERM or HUP to this script alone (a supervisor's,
# CI's limit) stops the guests at once. Bash dies of an untrapped TERM at once, leaving a
# foreground COMMAND to run on (and a guest killed under rxe-vm.sh to boot again), and runs a
# trap only once COMMAND has returned. So COMMAND runs in the background, waited for: the signal
# is passed on to it as TERM (test/vm's scripts stop their guests on it; in the background they
# ignore INT), COMMAND is waited for, and the script then takes the signal as it would have
# without run_vm (its own trap, if any).
run_vm() {
  local rc=0
  RUN_VM_TRAPS=$(trap -p INT TERM HUP) RUN_VM_PID= RUN_VM_SIG=
  trap 'stop_vm INT' INT; trap 'stop_vm TERM' TERM; trap 'stop_vm HUP' HUP
  "$@" &
  RUN_VM_PID=$!
  [[ -z $RUN_VM_SIG ]] || kill -"$RUN_VM_SIG" $$   # one that came before its pid was known
  wait "$RUN_VM_PID" || rc=$?
  trap - INT TERM HUP; eval "$RUN_VM_TRAPS"
  return "$rc"
}
stop_vm() { # SIGNAL: run_vm's trap
  # Before run_vm has COMMAND's pid, COMMAND may have started: run_vm sends SIGNAL again then.
  [[ -n $RUN_VM_PID ]] || { RUN_VM_SIG=$1; return; }
  { kill -TERM "$RUN_VM_PID" 2>/dev/null; wait "$RUN_VM_PID" 2>/dev/null; } || true
  trap - INT TERM HUP; eval "$RUN_VM_TRAPS"
  kill -"$1" $$
}

# Counting `-test.v` / `go test -v` output: every --- PASS/FAIL/SKIP line (subtests too; a
# test that logs a child test binary's output prefixes its lines, see softroce.ChildOutput,
# so that they are not counted). A package or binary that failed without any failing test (build
# error, crash, timeout) counts as one failure; so does a single binary (RC given) whose exit
# status is missing or not a number, or that ran no test at all. Prints "PASSED FAILED SKIPPED".
count_verbose() { # LOG [RC-of-a-single-binary]
  awk -v rc="${2-unset}" '
    /^ *--- PASS: / {p++} /^ *--- SKIP: / {s++}
    /^ *--- FAIL: / {f++; pf++}
    /^(ok|FAIL|\?) *\t/ || /^FAIL\t/ { if ($1 == "FAIL" && pf == 0) {f++; extra++} pf = 0 }
    END {
      if (rc != "unset") {
        if (rc !~ /^[0-9]+$/ || (rc != 0 && f == 0) || p + f + s == 0) f++
      }
      print p+0, f+0, s+0 }' "$1"
}

# unexpected_skips ALLOWED LOG...: the tests that skipped in LOGs (-test.v output) and whose
# name does not match the regexp ALLOWED, each named on stderr; prints how many there were.
unexpected_skips() {
  local allowed=$1 n=0 name; shift
  for name in $(grep -ohE '^ *--- SKIP: [^ ]+' "$@" 2>/dev/null | awk '{print $3}' | sort -u); do
    [[ $name =~ $allowed ]] && continue
    say "$name skipped in the guest, where it should run (counted as a failure)" >&2; n=$((n + 1))
  done
  echo "$n"
}

# kernel_trouble DIR...: 1 for each guest run dir whose dmesg.log (saved by test/vm/rxe-vm.sh)
# matches KERNEL_TROUBLE, with the lines on stderr; prints the count. A run dir without a
# dmesg.log (the guest did not get that far) counts nothing here: its tests have failed already.
kernel_trouble() {
  local d n=0
  for d in "$@"; do
    [[ -s $d/dmesg.log ]] && grep -qE "$KERNEL_TROUBLE" "$d/dmesg.log" || continue
    say "kernel trouble in the guest ($d/dmesg.log, counted as a failure):" >&2
    grep -E -m 20 "$KERNEL_TROUBLE" "$d/dmesg.log" >&2; n=$((n + 1))
  done
  echo "$n"
}
