#!/usr/bin/env bash
# test/run-tests.sh - all of goxrc's tests. Run as root on a Debian bookworm(-compatible) machine:
#   test/run-tests.sh   (as a user with sudo: sudo test/run-tests.sh)
# 1. installs missing Debian packages and Go (nothing when all is there),
# 2. on the host: gofmt -l (nothing listed), go vet, a CGO_ENABLED=0 build, GOOS=darwin and GOARCH=386 go vet (tests included),
#    go test of internal/fdpoll without -race (its allocation tests), go test -race ./...,
# 3. builds the VM_PACKAGES' test binaries on the host and runs them all in ONE soft-RoCE
#    VM (test/vm/rxe-vm.sh) with -test.v, and after them, in the same guest, -race builds
#    (VM_RACE; test/integration's beside its plain build, on a second device: BESIDE_PKG),
#    then, with GOXRC_TEST_ASAN=1, -asan builds of the VM_PACKAGES (AddressSanitizer and, at
#    each binary's exit, LeakSanitizer on the cgo code; about 400 s more, so not in CI),
#    then the integration binary's TestTwoNodes across
#    two guests on one wire (test/vm/rxe-pair.sh; counted with the guest's tests). Before each
#    binary the guest checks with rping that the kernel's CM on rxe0 answers, and makes the
#    device again where it does not (test/vm/guest.sh; the summary says so),
# 4. prints counts for the host and the guest; the last line is "N passed, N failed, N skipped".
# Exit status: 0 only if every check and test passed. Logs: $LOGS (printed at the end).
set -euo pipefail

# Packages whose tests need real RDMA: built with `go test -c`, run in the VM as root with
# RXE_DEV RXE_NETDEV RXE_IP RXE_PEER_IP set. (They also run, and skip, on the host.)
VM_PACKAGES=(./test/integration ./xrc ./internal/kernel/kcm ./verbs ./rdmacm)
# PACKAGE=TESTS: of those, the only tests run in the VM (-test.run). xrc's other tests run on the
# in-memory model alone, which the host run has under -race, and which emulation only slows (95 s
# of the guest's time at the fifty-first stop); its tests of the real CM are TestHybrid* (and
# TestReal*, which need an XRC device: they skip).
VM_RUN=("./xrc=^(TestHybrid|TestReal)")
# Built again with -race and run in the same guest after them: the data race detector on the
# paths only real RDMA takes (the CM and completion pumps, device events, the kernel CM under
# XRC; cm's device internals). PACKAGE=TESTS runs only the tests matching TESTS (-test.run).
VM_RACE=("./test/integration=^(TestCM|TestRDMACM|TestVerbsAsyncErr)" "./xrc=Hybrid" ./internal/kernel/kcm "./verbs=^TestFailedDestroy"
         "./cm=^TestDevice")
# PACKAGE=TESTS: of those, tests the -race build skips (-test.skip), having run in the plain one:
# an allocation count, which is the plain build's property, and tests that spend their time
# asleep on the library's timers (a QP's cool-off, a device's idle time): 80 s of emulation;
# and TestCMErrorAnywhere, whose 29 runs spend most of their 85 s in the CM's time-wait.
VM_RACE_SKIP=("./test/integration=^(TestCMSendRecvZeroAllocs|TestCMQueuePairsReused|TestCMDialerKeepsIdleDevice|TestCMErrorAnywhere)$")
# PACKAGE=TESTS: of those, tests the -asan build skips: allocation counts (an -asan build of
# the standard library allocates where the plain one does not: context's cancelCtx.Err).
VM_ASAN_SKIP=("./test/integration=^TestCMSendRecvZeroAllocs$")
# The -race build of BESIDE_PKG runs beside the plain build of it rather than after it, on a
# soft-RoCE device of its own (BESIDE_DEV, made by rxe-setup in the guest): the plain integration
# tests spend most of their time asleep in the CM's time-wait of about 2 s, which every Close of a
# connection waits out, and the -race build fills that time (at the fifty-sixth stop one after
# the other took 300 s + 216 s, side by side about 290 s). The leak checks count only their own
# process's kernel objects (softroce.ProcessResources). Tests matching BESIDE_ALONE make and
# remove soft-RoCE devices of fixed names (or make one): in the -race build they run later, alone
# (test/harness's TestBesideRunsNoSharedChanges finds any that is missing).
BESIDE_PKG=./test/integration
BESIDE_ALONE='^(TestCMListenDeviceLinkLocalOnly|TestCMDeviceRemoval|TestCMDeviceRemovalAfterEnds|TestCMIdleDeviceRemoval|TestCMRemovedDeviceKeptForRegion|TestCMIdleDeviceGivesBackLockedMemory|TestCMRegionTakesKeptBuffersMemory|TestCMPortEvents|TestCMXRCPreferListenerPortZeroRetries)$'
# Of those, tests that change what the whole guest shares (the kernel's ephemeral port range) run
# in the -race build's run alone only: in the plain build, beside which the -race build runs, its
# Listens on port 0 met the narrowed range (EADDRNOTAVAIL), and the other way round.
PLAIN_SKIP='^TestCMXRCPreferListenerPortZeroRetries$'
BESIDE_DEV=(-rxe rxe9 -netdev veth8 -peer veth9 -addr 10.77.9.1/24 -peer-addr 10.77.9.2/24)
# The only tests that may skip in the guest: they need XRC, which soft-RoCE lacks, or a second
# node (TestTwoNodes runs across two guests below, where it must not skip). Any other skip in
# the guest counts as a failure: there the feature should exist.
GUEST_SKIPS='^(TestTwoNodes|TestXRCDeviceCM|TestXRCRealSkipsWithoutXRC|TestReal[A-Za-z]+)$'
# Kernel trouble in a guest's dmesg (test/vm/rxe-vm.sh saves it): a failure even if every test
# passed, since an oops or a WARN in rxe or the CM may leave the tests' results meaningless.
KERNEL_TROUBLE='Oops|BUG:|WARNING:|Call Trace|general protection|soft lockup|blocked for more than'
VM_TEST_TIMEOUT=${GOXRC_VM_TEST_TIMEOUT:-12m}  # -test.timeout for each binary in the VM (the plain integration one takes about 6 min on a quiet host; 8 min was passed on a loaded one)
VM_TIMEOUT=${GOXRC_VM_TIMEOUT:-1500}           # hard limit for the whole VM run, seconds (it takes 340-550)

source "$(dirname "$0")/lib.sh"
need_root "$@"
cd "$REPO"
START=$SECONDS
LOGS=$(mkdir -p "$VM_WORK/test-logs" && mktemp -d "$VM_WORK/test-logs/$(date +%Y%m%d-%H%M%S)-XXXX")
# Keep the last 10 runs' logs; each holds its test binaries (about 64 MB).
ls -d "$VM_WORK"/test-logs/*/ 2>/dev/null | sort | head -n -10 | xargs -r -d '\n' rm -rf
# Stopped early (CI's limit, ^C), leave no guest running: qemu runs in its own process group.
kill_guests() { # a qemu whose pid file is left (only qemu's own: pids are reused)
  local q pid
  for q in "$LOGS"/vm/qemu.pid "$LOGS"/pair/*/qemu.pid; do
    # qemu's command line names its pid file: a pid reused by another run's qemu does not
    [[ -s $q ]] && pid=$(cat "$q") && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$q" &&
      kill -9 "$pid" 2>/dev/null
  done
  true
}
trap kill_guests EXIT
trap 'exit 130' INT   # so that the EXIT trap runs then too (after run_vm has stopped a guest)
CHECKS=() CHECKS_FAILED=0

install_packages
ensure_go
prepare_vm

check() { # NAME COMMAND...: run a check, log its output, remember the result
  local name=$1 t=$SECONDS; shift
  say "$name"
  if "$@" > "$LOGS/$name.log" 2>&1; then
    CHECKS+=("ok    $name ($((SECONDS - t))s)")
  else
    cat "$LOGS/$name.log"
    CHECKS+=("FAIL  $name ($((SECONDS - t))s, $LOGS/$name.log)"); CHECKS_FAILED=$((CHECKS_FAILED + 1))
  fi
}
check gofmt bash -c 'files=$("$(go env GOROOT)/bin/gofmt" -l .) && { [[ -z $files ]] || { echo "not formatted by gofmt:"; echo "$files"; false; }; }'
check go-vet go vet ./...
check build-nocgo env CGO_ENABLED=0 go build ./...
check vet-darwin env GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 go vet ./...  # the tests too
check vet-386 env GOARCH=386 CGO_ENABLED=0 go vet ./...  # 32-bit int: constants that overflow it
# fdpoll's zero-allocation tests skip under -race (the detector allocates on its own), and the host
# tests below are -race only; this package is not among the guest's plain builds either.
check fdpoll-norace go test -count=1 ./internal/fdpoll/

# ---- host tests
say "go test -race -count=1 ./... (host; RDMA tests skip here)"
t=$SECONDS
HOST_RC=0
go test -race -count=1 -v ./... > "$LOGS/host-tests.log" 2>&1 || HOST_RC=$?
grep -E '^(ok|FAIL|\?) *	|^ *--- FAIL|^panic:' "$LOGS/host-tests.log" || true
read -r HP HF HS < <(count_verbose "$LOGS/host-tests.log")
[[ $HOST_RC == 0 || $HF -gt 0 ]] || HF=1
HOST_TIME=$((SECONDS - t))

# ---- VM tests: build on the host, run all binaries in one guest
say "building VM test binaries: ${VM_PACKAGES[*]}"
BIN=$LOGS/bin; mkdir -p "$BIN"
GUEST=$LOGS/guest-tests.sh
BUILD_FAILED=0
{
  printf '#!/bin/bash\n# generated by test/run-tests.sh: runs in the VM\n'
  # RXE_SETUP: the guest's own build of test/cmd/rxe-setup (test/vm/rxe-vm.sh exports it), not
  # $VM_WORK/bin/rxe-setup, which a run of another checkout may have built over meanwhile.
  printf 'TEST_TIMEOUT=%q BESIDE_DEV=(%s)\n' "$VM_TEST_TIMEOUT" "$(printf '%q ' "${BESIDE_DEV[@]}")"
  printf 'source %q\n' "$REPO/test/vm/guest.sh"
  cat <<'GUEST_EOF'
# The second device's RXE_DEV=... RXE_NETDEV=... RXE_IP=... RXE_PEER_IP=..., as rxe-setup prints them.
mapfile -t BESIDE_ENV < <("$RXE_SETUP" "${BESIDE_DEV[@]}" 2>> "$RXE_VM_OUT/setup.log")
[[ ${BESIDE_ENV[0]} == RXE_DEV=* ]] || { BESIDE_ENV=(); echo "second soft-RoCE device: rxe-setup failed (setup.log)"; }
GUEST_EOF
} > "$GUEST"
VM_NAMES=() FIRST=() PLAIN=() RACE=() ASAN=() BESIDE=()
spec_of() { # PACKAGE SPEC...: the TESTS of the PACKAGE=TESTS spec for PACKAGE, if any
  local pkg=$1 spec; shift
  for spec; do [[ ${spec%%=*} != "$pkg" ]] || echo "${spec#*=}"; done
}
guest_line() { # FUNCTION NAME PACKAGE BIN [FLAG VALUE]...: a line of the guest script; empty VALUEs left out
  local line; line=$(printf '%s %q %q %q' "$1" "$2" "$REPO/${3#./}" "$4"); shift 4
  while [[ $# -gt 1 ]]; do [[ -z $2 ]] || line+=$(printf ' %s %q' "$1" "$2"); shift 2; done
  echo "$line"
}
build_test() { # NAME PACKAGE [GO TEST FLAGS...]: go test -c into $BIN/NAME.test; a failure is counted
  local name=$1 pkg=$2; shift 2
  if ! go test "$@" -c -o "$BIN/$name.test" "$pkg" > "$LOGS/build-$name.log" 2>&1; then
    cat "$LOGS/build-$name.log"; BUILD_FAILED=$((BUILD_FAILED + 1)); return 1
  fi
  if [[ ! -x $BIN/$name.test ]]; then say "$pkg: no test files (counted as a failure)"; BUILD_FAILED=$((BUILD_FAILED + 1)); return 1; fi
}
for pkg in "${VM_PACKAGES[@]}"; do
  name=$(echo "${pkg#./}" | tr / _)
  build_test "$name" "$pkg" || continue
  if [[ $pkg == "$BESIDE_PKG" ]]; then
    FIRST+=("$(guest_line run "$name" "$pkg" "$BIN/$name.test" -test.run "$(spec_of "$pkg" "${VM_RUN[@]}")" -test.skip "$PLAIN_SKIP")")
  else
    PLAIN+=("$(guest_line run "$name" "$pkg" "$BIN/$name.test" -test.run "$(spec_of "$pkg" "${VM_RUN[@]}")")")
  fi
  VM_NAMES+=("$name")
done
for spec in "${VM_RACE[@]}"; do
  pkg=${spec%%=*} filter=
  [[ $spec != *=* ]] || filter=${spec#*=}
  name=race_$(echo "${pkg#./}" | tr / _)
  build_test "$name" "$pkg" -race || continue
  skip=$(spec_of "$pkg" "${VM_RACE_SKIP[@]}")
  if [[ $pkg == "$BESIDE_PKG" ]]; then
    BESIDE+=("$(guest_line beside "$name" "$pkg" "$BIN/$name.test" -test.run "$filter" -test.skip "${skip:+$skip|}$BESIDE_ALONE")")
    RACE+=("$(guest_line run "${name}_alone" "$pkg" "$BIN/$name.test" -test.run "$BESIDE_ALONE")")
    VM_NAMES+=("$name" "${name}_alone")
  else
    RACE+=("$(guest_line run "$name" "$pkg" "$BIN/$name.test" -test.run "$filter" -test.skip "$skip")")
    VM_NAMES+=("$name")
  fi
done
if [[ ${GOXRC_TEST_ASAN:-0} == 1 ]]; then
  for pkg in "${VM_PACKAGES[@]}"; do
    name=asan_$(echo "${pkg#./}" | tr / _)
    build_test "$name" "$pkg" -asan || continue
    ASAN+=("$(guest_line run "$name" "$pkg" "$BIN/$name.test" -test.run "$(spec_of "$pkg" "${VM_RUN[@]}")" \
      -test.skip "$(spec_of "$pkg" "${VM_ASAN_SKIP[@]}")")")
    VM_NAMES+=("$name")
  done
fi
# The background runs start first and are waited for once the first plain binary is done.
printf '%s\n' "${BESIDE[@]}" "${FIRST[@]}" wait "${PLAIN[@]}" "${RACE[@]}" "${ASAN[@]}" | grep -v '^$' >> "$GUEST"
GP=0 GF=$BUILD_FAILED GS=0 VM_RC=0
if [[ ${#VM_NAMES[@]} -gt 0 ]]; then
  say "running ${#VM_NAMES[@]} test binary(ies) in the VM"
  run_vm "$REPO/test/vm/rxe-vm.sh" -t "$VM_TIMEOUT" -o "$LOGS/vm" bash "$GUEST" || VM_RC=$?
  for name in "${VM_NAMES[@]}"; do
    if [[ ! -s $LOGS/vm/$name.rc ]]; then
      say "$name: did not run to the end in the VM"; GF=$((GF + 1)); continue
    fi
    read -r p f s < <(count_verbose "$LOGS/vm/$name.log" "$(cat "$LOGS/vm/$name.rc")")
    GP=$((GP + p)) GF=$((GF + f)) GS=$((GS + s))
  done
  [[ $VM_RC != 125 ]] || say "the VM did not complete (see $LOGS/vm/console.log)"
  logs=(); for name in "${VM_NAMES[@]}"; do logs+=("$LOGS/vm/$name.log"); done
  GF=$((GF + $(unexpected_skips "$GUEST_SKIPS" "${logs[@]}") + $(kernel_trouble "$LOGS/vm")))
fi

# ---- two nodes: the integration binary again, in two guests on one wire (test/vm/rxe-pair.sh):
# TestTwoNodes serves in A and checks in B, which has the host kill A outright midway.
PAIR_NOTE="not run"
if [[ -x $BIN/test_integration.test ]]; then
  say "two nodes: TestTwoNodes in two guests on one wire"
  INT=$REPO/test/integration PAIR_RC=0
  run_role() { printf 'cd %q && GOXRC_PAIR_ROLE=%s %q -test.v -test.count=1 -test.run %q -test.timeout 4m' \
    "$INT" "$1" "$BIN/test_integration.test" '^TestTwoNodes$'; }
  run_vm "$REPO/test/vm/rxe-pair.sh" -q -o "$LOGS/pair" -t 300 --a "$(run_role a)" --b "$(run_role b)" \
    > "$LOGS/pair.log" 2>&1 || PAIR_RC=$?
  grep -E '^\[B\] *(--- |ok|FAIL|PASS)|^rxe-pair:' "$LOGS/pair.log" || true
  touch "$LOGS/pair/b/output.log" "$LOGS/pair/a/output.log"
  read -r p f s < <(count_verbose "$LOGS/pair/b/output.log" "$PAIR_RC")
  # A is killed midway, so it reports no result of its own; what it failed before counts.
  fa=$(grep -cE '^ *--- FAIL: |^panic: ' "$LOGS/pair/a/output.log" || true)
  # In the pair, TestTwoNodes must run: any skip fails.
  f=$((f + fa + $(unexpected_skips '^$' "$LOGS/pair/b/output.log") + $(kernel_trouble "$LOGS/pair/a" "$LOGS/pair/b")))
  GP=$((GP + p)) GF=$((GF + f)) GS=$((GS + s))
  PAIR_NOTE="$p passed, $f failed, $s skipped (exit $PAIR_RC, $LOGS/pair.log)"
fi

# ---- summary
# What the guest saw when a binary failed or the device stopped answering rping (the guest
# script's diag): on CI only this output is kept.
[[ ! -s $LOGS/vm/diag.log ]] || { say "guest diagnostics ($LOGS/vm/diag.log)"; head -n 80 "$LOGS/vm/diag.log"; }
echo
echo "==================== summary ($((SECONDS - START))s, logs in $LOGS)"
printf '  %s\n' "${CHECKS[@]}"
printf '  host:  %d passed, %d failed, %d skipped   (go test -race ./..., %ss)\n' "$HP" "$HF" "$HS" "$HOST_TIME"
printf '  guest: %d passed, %d failed, %d skipped   (%s, and two nodes; boot to command %ss, VM total %ss)\n' "$GP" "$GF" "$GS" \
  "${VM_NAMES[*]:-nothing to run}" "$(sed -n 's/boot_to_command_s=\([0-9]*\.\{0,1\}[0-9]\{0,1\}\).*/\1/p' "$LOGS/vm/timings" 2>/dev/null)" \
  "$(sed -n 's/total_s=\([0-9]*\.\{0,1\}[0-9]\{0,1\}\).*/\1/p' "$LOGS/vm/timings" 2>/dev/null)"
printf '  two nodes: %s\n' "$PAIR_NOTE"
[[ ! -s $LOGS/vm/wedged.log ]] || sed 's/^/  guest: /' "$LOGS/vm/wedged.log"
[[ $CHECKS_FAILED == 0 ]] || echo "  ($CHECKS_FAILED failed check(s) are counted as failures below)"
FAILED=$((HF + GF + CHECKS_FAILED))
[[ $FAILED -gt 0 || $VM_RC == 0 ]] || FAILED=1   # the VM failed although no test did
echo "$((HP + GP)) passed, $FAILED failed, $((HS + GS)) skipped"
[[ $FAILED == 0 ]]
