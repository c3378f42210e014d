#!/usr/bin/env bash
# rxe-pair.sh - two soft-RoCE guests on one virtual wire: two kernels, two RDMA CMs, two rxe0s,
# as two nodes. Guest A is 10.88.0.1, guest B 10.88.0.2, each with one vCPU (two TCG guests on
# two host cores boot faster so), joined by virtio-net NICs whose qemu backends meet on a unix
# stream socket: no IP traffic on the host. Each is a test/vm/rxe-vm.sh guest with rxe0 on the
# NIC (RXE_DEV RXE_IP RXE_PEER_IP as there).
#
# Usage: test/vm/rxe-pair.sh [-o DIR] [-t SEC] [-q] --a 'SCRIPT for A' --b 'SCRIPT for B'
#   -o DIR   pair dir (default WORK/pairs/<time>-XXXX, WORK as in rxe-vm.sh: GOXRC_VM_WORK,
#            default /var/cache/goxrc-vm): a/ and b/ (each guest's run dir), sync/ (shared
#            read-write by both guests: RXE_PAIR_SYNC), wire.sock
#   -t SEC   limit for each guest (default 300)
#   -q       print each guest's output at the end (prefixed [A] / [B]) instead of live
# The guests coordinate through marker files in $RXE_PAIR_SYNC. One marker is the host's:
# when $RXE_PAIR_SYNC/kill-a appears, the host kills guest A's qemu with SIGKILL at once, so
# node A vanishes from the wire as a machine that loses power does (no FIN, no DREQ, nothing).
# Exit code: B's (125 if B did not complete). A's counts only when it fails on its own: then 1
# (A killed through kill-a is expected). Must run as root.
set -euo pipefail

SELF=$(realpath "${BASH_SOURCE[0]}")
VM=$(dirname "$SELF")/rxe-vm.sh
OUT= TIMEOUT=300 QUIET=() A= B=
log() { echo "rxe-pair: $*" >&2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    -o) OUT=$2; shift 2;;
    -t) TIMEOUT=$2; shift 2;;
    -q) QUIET=(-q); shift;;
    --a) A=$2; shift 2;;
    --b) B=$2; shift 2;;
    -h|--help) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) log "unknown argument $1 (try --help)"; exit 125;;
  esac
done
[[ -n $A && -n $B ]] || { log "--a and --b are required"; exit 125; }
if [[ -z $OUT ]]; then
  WORK=$(realpath -m "${GOXRC_VM_WORK:-/var/cache/goxrc-vm}")   # as test/vm/rxe-vm.sh
  mkdir -p "$WORK/pairs"
  { ls -1d "$WORK"/pairs/*/ 2>/dev/null || true; } | head -n -30 | xargs -r -d '\n' rm -rf   # keep the last 30, as rxe-vm.sh its runs
  OUT=$(mktemp -d "$WORK/pairs/$(date +%Y%m%d-%H%M%S)-XXXX")
fi
mkdir -p "$OUT"/{a,b,sync} && OUT=$(realpath "$OUT")
rm -f "$OUT"/sync/* "$OUT/wire.sock"
SYNC=$OUT/sync
"$VM" --prepare > "$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log" >&2; exit 125; }   # not twice at once

guest() { # NAME MODE IP PEER SCRIPT: starts the guest's rxe-vm.sh in the background ($! its pid), its
  # output prefixed [NAME] by a sed of this script's, which the last wait below waits for. The sed
  # ignores what the guest outlives (^C or CI's TERM to the process group) and ends with its output:
  # killed, it lost the guest's last lines, and rxe-vm.sh died of SIGPIPE writing them (on TERM
  # even before its trap had stopped qemu, writing bash's notice of its sleep killed).
  local out
  exec {out}> >(trap '' INT TERM HUP; exec sed -u "s/^/[${1^^}] /")
  "$VM" -s 1 -t "$TIMEOUT" -o "$OUT/$1" ${QUIET[@]+"${QUIET[@]}"} --nic "$2:$OUT/wire.sock" --ip "$3/24" --peer "$4" \
    --rw "$SYNC" -e "RXE_PAIR_SYNC=$SYNC" "$5" >&"$out" 2>&1 &
  exec {out}>&-
}
# On TERM or HUP (CI's limit), stop both guests as rxe-vm.sh stops on TERM: B's exit status (125)
# is then this script's. On INT (^C) too, which they ignore (started in the background), and then
# end by SIGINT, as rxe-vm.sh does, so that a caller stops too. Set before they start, so that one
# which comes as they start stops them too.
# The guests it stops are bash's running jobs, not $APID $BPID: once bash has reaped a guest, its
# pid may be another process's (B runs on, for a minute or more, after it has had A killed).
APID= BPID= STOPPED=0
stop_guests() { STOPPED=1; kill $(jobs -rp) 2>/dev/null || true; }
trap stop_guests TERM HUP
trap 'stop_guests; wait; trap - INT; kill -INT $$' INT
guest a listen 10.88.0.1 10.88.0.2 "$A"; APID=$!
guest b connect 10.88.0.2 10.88.0.1 "$B"; BPID=$!
[[ $STOPPED == 0 ]] || stop_guests

# Whether the guest PID still runs: among bash's running jobs, as in stop_guests. kill -0 took for
# a guest a process that got its pid once bash had reaped it (A's: told it to stop, and waited 30 s
# for it; B's: watched it until it ended).
runs() { [[ $'\n'$(jobs -rp)$'\n' == *$'\n'"$1"$'\n'* ]]; }

# Kill A's qemu when B asks (see above); stop watching once B is done.
KILLED=0
while runs "$BPID"; do
  if [[ $KILLED == 0 && -e $SYNC/kill-a ]]; then
    if [[ -s $OUT/a/qemu.pid ]] && kill -9 "$(cat "$OUT/a/qemu.pid")" 2>/dev/null; then
      log "node A killed (SIGKILL to its qemu), as B asked"
      KILLED=1
    else
      log "B asked to kill node A, which was not running"   # A's own exit status stands
      KILLED=2
    fi
    : > "$SYNC/a-killed"
  fi
  # || true: a TERM or HUP sent to the whole process group (CI's limit) kills the sleep too, and
  # set -e took its status for this script's failure: it ended with 143, before the guests.
  sleep 0.1 || true
done
BRC=0; wait "$BPID" || BRC=$?
# A has nothing left to talk to: stop it if it still runs.
if runs "$APID"; then
  : > "$SYNC/b-done"
  for ((i = 0; i < 300; i++)); do runs "$APID" || break; sleep 0.1 || true; done   # || true: as above
  # Not asked for by B: A did not end on its own (a hung server, say), which is A's failure.
  if runs "$APID" && [[ -s $OUT/a/qemu.pid ]] && kill -9 "$(cat "$OUT/a/qemu.pid")" 2>/dev/null; then
    log "node A still ran 30 s after B was done: killed (A's failure)"
  fi
fi
# A signal's trap cuts the wait short (status > 128, taken for A's): wait again then, which waits
# on for A or, once A has ended, returns its status (bash keeps it). STOPPED, read above only,
# says whether one came.
until STOPPED=0 ARC=0; wait "$APID" || ARC=$?; [[ $STOPPED == 0 ]]; do :; done
# The seds: each guest's last lines before this script's. A signal's trap cuts the wait short
# (status > 128, which set -e took for this script's failure): the guests have ended, so wait on.
until wait; do :; done
log "A exit $ARC$([[ $KILLED == 1 ]] && echo ' (killed by the host, as intended)'), B exit $BRC; pair dir $OUT"
[[ $BRC != 0 ]] && exit "$BRC"
[[ $ARC == 0 || $KILLED == 1 ]] || exit 1
exit 0
