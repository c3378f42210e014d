#!/usr/bin/env bash
# rxe-vm.sh - run a command in a throw-away qemu (TCG) guest that boots Debian
# bookworm's stock kernel with soft-RoCE (rdma_rxe). The guest's root is this
# machine's root, shared read-only over virtio-9p with a tmpfs overlay on top,
# so host-built binaries (go test -c ...) run there unchanged.
#
# Usage: test/vm/rxe-vm.sh [options] [--] COMMAND [ARGS...]
#        test/vm/rxe-vm.sh [options] 'shell snippet using $RXE_IP'
#        test/vm/rxe-vm.sh --prepare
# Options (environment variable in brackets):
#   -w, --work DIR       cache and run dirs   [GOXRC_VM_WORK, default /var/cache/goxrc-vm]
#   -o, --out DIR        output dir of this run (default WORK/runs/<time>-XXXX)
#   -t, --timeout SEC    limit for the whole VM  [GOXRC_VM_TIMEOUT, default 900]
#       --cmd-timeout S  limit for COMMAND in the guest (default: timeout - 30)
#   [GOXRC_VM_BOOT_LIMIT] seconds for the guest to reach COMMAND (default 180; it takes 10-20)
#                        before the boot counts as hung: it is killed and booted once more
#   -m, --mem SIZE       guest RAM            [GOXRC_VM_MEM, default 2G]
#   -s, --smp N          guest vCPUs          [GOXRC_VM_SMP, default 2]
#   -k, --kver ABI       Debian kernel ABI    [GOXRC_VM_KVER, default 6.1.0-47-amd64]
#       --append ARGS    extra guest kernel parameters [GOXRC_VM_APPEND]
#   -e, --env K=V        export K=V to COMMAND (repeatable)
#       --rw DIR         share DIR read-write at the same path (repeatable)
#       --no-rxe         no RDMA modules, no veth, no rxe0
#       --nic MODE:SOCK  a virtio-net NIC (the wire to another guest: test/vm/rxe-pair.sh) whose
#                        qemu backend is the unix stream socket SOCK, MODE listen or connect;
#                        rxe0 then sits on that NIC instead of veth0
#       --ip CIDR        the NIC's address      --peer IP   the other guest's (RXE_PEER_IP)
#       --mac MAC        the NIC's MAC (default from --ip; rxe's node GUID comes from it)
#   -q, --quiet          print COMMAND's output at the end instead of live
#   -v, --verbose        kernel messages on the console log
#       --prepare        install packages, fetch the kernel, build initramfs + rxe-setup, exit
# The guest: rdma_rxe ib_uverbs rdma_ucm ib_umad veth loaded; veth0 10.77.0.1/24 <-> veth1
# 10.77.0.2/24; rxe0 on veth0 (made by test/cmd/rxe-setup); ulimit -l unlimited; cwd = the
# caller's; exported RXE_DEV RXE_NETDEV RXE_IP RXE_PEER_IP RXE_VM_OUT (the run dir, shared
# read-write at the same path) RXE_SETUP (this run's build of test/cmd/rxe-setup, for more
# devices). Writes anywhere else vanish at power-off.
# Exit code: COMMAND's (124 = it hit --cmd-timeout); 125 = the VM did not complete
# (console tail printed). Must run as root.
set -euo pipefail

SELF=$(realpath "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/../.." && pwd)
WORK=${GOXRC_VM_WORK:-/var/cache/goxrc-vm}
VM_TIMEOUT=${GOXRC_VM_TIMEOUT:-900}
MEM=${GOXRC_VM_MEM:-2G}
SMP=${GOXRC_VM_SMP:-2}
KVER=${GOXRC_VM_KVER:-6.1.0-47-amd64}
EXTRA_APPEND=${GOXRC_VM_APPEND:-}
CMD_TIMEOUT= OUT= RXE_SETUP= RXE=1 QUIET=0 VERBOSE=0 PREPARE=0 NIC= NIC_IP= NIC_PEER= NIC_MAC=
RW_DIRS=() ENVS=()
# procps: ps, for test/vm/guest.sh's diagnostics of a hung command (not in every Debian install).
PACKAGES=(qemu-system-x86 rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest
          libibverbs-dev librdmacm-dev iproute2 busybox-static cpio kmod bc procps)
INITRD_MODS=(virtio_pci 9pnet_virtio 9p overlay)   # needed to mount the root; deps are added

log() { echo "rxe-vm: $*" >&2; }
die() { log "$*"; exit 125; }

while [[ $# -gt 0 ]]; do
  case $1 in
    -w|--work) WORK=$2; shift 2;;
    -o|--out) OUT=$2; shift 2;;
    -t|--timeout) VM_TIMEOUT=$2; shift 2;;
    --cmd-timeout) CMD_TIMEOUT=$2; shift 2;;
    -m|--mem) MEM=$2; shift 2;;
    -s|--smp) SMP=$2; shift 2;;
    -k|--kver) KVER=$2; shift 2;;
    --append) EXTRA_APPEND=$2; shift 2;;
    -e|--env) ENVS+=("$2"); shift 2;;
    --rw) RW_DIRS+=("$(realpath "$2")"); shift 2;;
    --no-rxe) RXE=0; shift;;
    --nic) NIC=$2; shift 2;;
    --ip) NIC_IP=$2; shift 2;;
    --peer) NIC_PEER=$2; shift 2;;
    --mac) NIC_MAC=$2; shift 2;;
    -q|--quiet) QUIET=1; shift;;
    -v|--verbose) VERBOSE=1; shift;;
    --prepare) PREPARE=1; shift;;
    -h|--help) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    --) shift; break;;
    -*) die "unknown option $1 (try --help)";;
    *) break;;
  esac
done
[[ $(id -u) == 0 ]] || die "must run as root (apt-get, qemu's 9p server reads the whole root)"
[[ $PREPARE == 1 || $# -gt 0 ]] || die "no command given (try --help)"
WORK=$(realpath -m "$WORK")
[[ $WORK != *[[:space:],:]* ]] || die "work dir must not contain spaces, commas or colons: $WORK"
mkdir -p "$WORK"

NICARGS=(-nic none)
if [[ -n $NIC ]]; then
  case $NIC in listen:/*) NIC_SERVER=on;; connect:/*) NIC_SERVER=off;; *) die "--nic wants listen:/SOCKET or connect:/SOCKET";; esac
  NIC_SOCK=${NIC#*:}
  [[ ${#NIC_SOCK} -lt 100 && $NIC_SOCK != *[[:space:],]* ]] || die "--nic socket path too long (unix sockets: 108 bytes) or has spaces or commas: $NIC_SOCK"
  [[ $NIC_IP == */* ]] || die "--nic needs --ip ADDRESS/PREFIX"
  if [[ -z $NIC_MAC ]]; then
    IFS=. read -r _ _ o3 o4 <<< "${NIC_IP%/*}"
    NIC_MAC=$(printf '52:54:00:88:%02x:%02x' "$o3" "$o4")
  fi
  NICARGS=(-netdev "stream,id=n0,server=$NIC_SERVER,addr.type=unix,addr.path=$NIC_SOCK" -device "virtio-net-pci,netdev=n0,mac=$NIC_MAC")
fi

source "$(dirname "${BASH_SOURCE[0]}")/../apt.sh"
ensure_packages() { apt_install "${PACKAGES[@]}" || die "apt-get install failed"; }

# Debian's kernel package, extracted under WORK/kernel/<abi>. When the pinned ABI has left
# the mirror, whatever linux-image-amd64 depends on now is used.
ensure_kernel() {
  KROOT=$WORK/kernel/$KVER/root
  local fb=$WORK/kernel/fallback.$KVER
  if [[ ! -f $KROOT/boot/vmlinuz-$KVER && -s $fb ]]; then   # the pinned ABI was gone before
    KVER=$(cat "$fb"); KROOT=$WORK/kernel/$KVER/root
  fi
  if [[ ! -f $KROOT/boot/vmlinuz-$KVER ]]; then
    local pkg=linux-image-$KVER-unsigned
    # Package lists older than the mirror may name a kernel it no longer has (old ABIs leave it
    # at each kernel update), and the download would fail on every run: refresh them first.
    while_locked apt-get "${APT_WAIT[@]}" update >&2 || true
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
      # || true: apt's failure (no linux-image-amd64 either) is said by die below, not by set -e.
      KVER=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -1 || true)
      [[ -n $KVER ]] || die "neither $pkg nor linux-image-amd64 is available"
      log "pinned kernel gone from the mirror, using $KVER"
      echo "$KVER" > "$fb"
      KROOT=$WORK/kernel/$KVER/root
      pkg=linux-image-$KVER-unsigned
      apt-cache show "$pkg" >/dev/null 2>&1 || pkg=linux-image-$KVER
    fi
  fi
  if [[ ! -f $KROOT/boot/vmlinuz-$KVER ]]; then
    log "downloading $pkg"
    local tmp=$WORK/kernel/$KVER/tmp
    rm -rf "$tmp" && mkdir -p "$tmp/root" && chmod 777 "$tmp"   # apt downloads as _apt
    (cd "$tmp" && while_locked apt-get download "$pkg" >&2)
    dpkg-deb -x "$tmp"/*.deb "$tmp/root"
    rm -rf "$KROOT" && mv "$tmp/root" "$KROOT" && rm -rf "$tmp"
  fi
  [[ -s $KROOT/lib/modules/$KVER/modules.dep.bin ]] || depmod -b "$KROOT" "$KVER"
}

# initramfs: static busybox, the modules to mount a 9p root with an overlay, and /init. Named by
# what it is built from (this script, busybox): a guest booted again (after a failed or hung
# boot) boots this one, not the one a run of another checkout sharing WORK has built meanwhile.
build_initramfs() {
  local stamp d m f b
  stamp=$(cat "$SELF" /bin/busybox | sha256sum | cut -c1-16)
  INITRD=$WORK/kernel/$KVER/initramfs-$stamp.cpio.gz
  if [[ -s $INITRD ]]; then touch "$INITRD"; return; fi
  # Those no run has prepared for a day (a run renews its own as it starts).
  find "$WORK/kernel/$KVER" -maxdepth 1 -name 'initramfs*.cpio.gz*' -mmin +1440 -delete 2>/dev/null || true
  log "building initramfs"
  d=$WORK/kernel/$KVER/initramfs.d
  rm -rf "$d" && mkdir -p "$d"/{bin,dev,proc,sys,lower,upper,newroot,modules}
  cp /bin/busybox "$d/bin/" && ln -s busybox "$d/bin/sh"
  for m in "${INITRD_MODS[@]}"; do
    modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
  done | awk '!seen[$0]++' | while read -r f; do
    b=$(basename "$f")
    case $b in
      *.ko.xz) xz -dc "$f" > "$d/modules/${b%.xz}"; b=${b%.xz};;
      *) cp "$f" "$d/modules/$b";;
    esac
    echo "$b" >> "$d/modules/order"
  done
  sed -n '/^#### INIT$/,/^#### END INIT$/p' "$SELF" | sed '1d;$d' > "$d/init"
  chmod 755 "$d/init"
  (cd "$d" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
}

find_go() { # the first go new enough for go.mod (Debian bookworm's /usr/bin/go, 1.19, is not)
  local need g have
  need=$(sed -n 's/^go \([0-9]*\.[0-9]*\).*/\1/p' "$REPO/go.mod")
  # The last: where test/lib.sh's ensure_go installs a toolchain it fetched.
  for g in "$(command -v go || true)" /usr/local/go/bin/go $(ls -d /usr/local/lib/goxrc-go/golang.org/toolchain@*/bin/go 2>/dev/null | sort -V -r); do
    [[ -x $g ]] || continue
    have=$("$g" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9.]*\).*/\1/p')
    if [[ -n $have && $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1) == "$need" ]]; then
      GO=$g; return
    fi
  done
  die "no go toolchain of go $need or later (needed to build test/cmd/rxe-setup); run test/run-tests.sh once to install one"
}

# rxe-setup creates veth0/veth1 and rxe0 in the guest through package test/softroce. Each build
# is kept under a name of its content, RXE_SETUP: the guest runs it as it boots, after this run's
# preparation, when a run of another checkout sharing WORK may have built its own (runs overlap;
# a fixed name would give this guest that checkout's). WORK/bin/rxe-setup is the last one built.
build_rxe_setup() {
  find_go
  mkdir -p "$WORK/bin"
  (cd "$REPO" && CGO_ENABLED=0 "$GO" build -o "$WORK/bin/rxe-setup.tmp" ./test/cmd/rxe-setup) ||
    die "cannot build test/cmd/rxe-setup"
  RXE_SETUP=$WORK/bin/rxe-setup-$(sha256sum < "$WORK/bin/rxe-setup.tmp" | cut -c1-16)
  mv "$WORK/bin/rxe-setup.tmp" "$RXE_SETUP"
  cp "$RXE_SETUP" "$WORK/bin/rxe-setup.tmp" && mv "$WORK/bin/rxe-setup.tmp" "$WORK/bin/rxe-setup"
  # Those no run has built for a day (a run rebuilds, and so renews, its own as it starts).
  find "$WORK/bin" -maxdepth 1 -name 'rxe-setup-*' -mmin +1440 -delete 2>/dev/null || true
}

exec 9> "$WORK/.lock"
flock 9            # one preparation at a time; runs themselves may overlap
ensure_packages
ensure_kernel
build_initramfs
[[ $RXE == 0 ]] || build_rxe_setup
exec 9>&-
if [[ $PREPARE == 1 ]]; then
  log "prepared: $KROOT/boot/vmlinuz-$KVER, $INITRD${RXE_SETUP:+, $RXE_SETUP}"
  [[ $# == 0 ]] && exit 0
fi

# ---------------------------------------------------------------- the run
[[ -n $CMD_TIMEOUT ]] || CMD_TIMEOUT=$(( VM_TIMEOUT > 60 ? VM_TIMEOUT - 30 : VM_TIMEOUT / 2 ))
if [[ -z $OUT ]]; then
  mkdir -p "$WORK/runs"
  { ls -1d "$WORK"/runs/*/ 2>/dev/null || true; } | head -n -30 | xargs -r rm -rf   # keep the last 30 runs
  OUT=$(mktemp -d "$WORK/runs/$(date +%Y%m%d-%H%M%S)-XXXX")
fi
mkdir -p "$OUT" && OUT=$(realpath "$OUT")
[[ $OUT != *[[:space:],:]* ]] || die "output dir must not contain spaces, commas or colons: $OUT"
rm -f "$OUT"/{.cmd-started,exit_code,output.log,console.log,setup.log,timings,guest-timings,dmesg.log,qemu.pid}

if [[ $# == 1 && $1 == *[[:space:]\;\|\&\$\<\>]* ]]; then
  printf '%s\n' "$1" > "$OUT/cmd.sh"          # one argument with shell syntax: a snippet
else
  printf '%q ' "$@" > "$OUT/cmd.sh"; echo >> "$OUT/cmd.sh"
fi
{
  printf 'KVER=%q\nMODDIR=%q\nRXE=%q\nCWD=%q\nCMD_TIMEOUT=%q\nRXE_SETUP=%q\n' \
    "$KVER" "$KROOT/lib/modules/$KVER" "$RXE" "$PWD" "$CMD_TIMEOUT" "${RXE_SETUP:-}"
  printf 'NIC_MAC=%q\nNIC_IP=%q\nNIC_PEER=%q\n' "$NIC_MAC" "$NIC_IP" "$NIC_PEER"
  for e in ${ENVS[@]+"${ENVS[@]}"}; do printf 'export %q\n' "$e"; done
} > "$OUT/params.sh"
sed -n '/^#### STAGE2$/,/^#### END STAGE2$/p' "$SELF" | sed '1d;$d' > "$OUT/stage2.sh"

VIRTFS=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$OUT,mount_tag=rxeout,security_model=none,multidevs=remap")
RWARG= i=0
for d in ${RW_DIRS[@]+"${RW_DIRS[@]}"}; do
  [[ $d != *[[:space:],:]* ]] || die "--rw dir must not contain spaces, commas or colons: $d"
  VIRTFS+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none,multidevs=remap")
  RWARG+="${RWARG:+,}rw$i:$d"; i=$((i + 1))
done
# An oops panics the guest (and so ends the run, failing what had not finished) rather than
# leaving a broken kernel under the tests that follow.
# no_timer_check: the kernel's check that the IO-APIC delivers timer ticks counts ticks in a busy
# loop, and under TCG on a loaded host it saw too few once and panicked the boot ("IO-APIC + timer
# doesn't work!"), failing a two-guest demo run.
APPEND="console=ttyS0 panic=-1 oops=panic rdinit=/init rxevm.out=$OUT${RWARG:+ rxevm.rw=$RWARG} mitigations=off nokaslr tsc=reliable no_timer_check"
[[ $VERBOSE == 1 ]] || APPEND+=" quiet loglevel=3"
APPEND+="${EXTRA_APPEND:+ $EXTRA_APPEND}"
QEMU=(qemu-system-x86_64 -machine q35 -accel tcg,thread=multi -cpu max -smp "$SMP" -m "$MEM"
      -kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$INITRD" -append "$APPEND" "${VIRTFS[@]}"
      -display none -vga none -monitor none -serial "file:$OUT/console.log" "${NICARGS[@]}" -nodefaults -no-reboot
      -pidfile "$OUT/qemu.pid")
printf '%q ' "${QEMU[@]}" > "$OUT/qemu-cmdline"

log "run dir $OUT (timeout ${VM_TIMEOUT}s)"
# A guest that has not reached the command after BOOT_LIMIT seconds (it takes 10-20) hung while
# booting: seen once in many runs, with nothing on the quiet console. Nothing of the command has
# run then, so it is killed and booted once more instead of waiting out the whole timeout.
BOOT_LIMIT=${GOXRC_VM_BOOT_LIMIT:-180}
ATTEMPTS=2 STOPPED=0
[[ -z $NIC ]] || ATTEMPTS=1   # the other guest's wire would not survive a second boot
# Until a boot's traps below are set (they need qemu's pid), a signal is only noted (STOPPED),
# and acted on once they are: one that came as qemu started ended this script at once, and
# qemu ran on for the whole timeout; one that came in the wait below ended it with 143, not 125.
note_signals() { trap 'STOPPED=INT' INT; trap 'STOPPED=1' TERM HUP; }
note_signals
# stop_boot kills this boot's qemu (and tail). timeout moves itself and qemu into a process group
# of its own, numbered by its pid: the group gets the signal too. A TERM that reaches timeout
# between its fork and its noting the child's pid ends it without passing the signal on (coreutils
# 9.1's cleanup: about 1 in 50,000 starts killed at once, in a loop), and qemu ran on for the whole
# -t (TestVMRunStopsSecondQemuStartedAsSignalCame, once in CI). Before timeout's setpgid there is
# no group, and no qemu yet; || true: between boots there is nothing to kill, and under set -e a
# failed kill would end the script inside its trap.
stop_boot() { kill -- -"$QPID" "$QPID" $TAILPID 2>/dev/null || true; }
if [[ $NIC == connect:* ]]; then
  # qemu connects once, at start: wait for the other guest's qemu to listen, or for a signal
  # (|| true: as the boot loop's sleep).
  for ((i = 0; i < 600; i++)); do [[ $STOPPED == 0 && ! -S $NIC_SOCK ]] || break; sleep 0.1 || true; done
  [[ $STOPPED != 0 || -S $NIC_SOCK ]] || die "no guest listens on $NIC_SOCK"
  sleep 0.3 || true   # bound, and listening by now
fi
for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
  note_signals   # again for each boot: the last boot's INT trap would kill that boot's qemu
  # The date ignores the signals noted: killed by one sent to the whole process group (^C, CI's
  # limit), it failed the assignment, and set -e ended this script with 130 or 143, not as below.
  T0=$(trap '' INT TERM HUP; date +%s.%N) T1= HUNG=0
  timeout -k 5 "$VM_TIMEOUT" "${QEMU[@]}" 2> "$OUT/qemu.stderr" &
  QPID=$! TAILPID=
  # On ^C, end by SIGINT ourselves: a caller (run-demo.sh, bench.sh) then
  # stops too, where an exit status would let it go on to its next guest.
  trap 'stop_boot; trap - INT; kill -INT $$' INT
  # On TERM or HUP (CI's limit), end as a VM that did not complete: a boot cut short so is not
  # booted again (STOPPED), which would run the whole command with no caller left to wait for it.
  trap 'STOPPED=1; stop_boot' TERM HUP
  # One that came before these traps (as qemu started, or between boots) stops this boot too.
  [[ $STOPPED != INT ]] || kill -INT $$
  [[ $STOPPED == 0 ]] || stop_boot
  while kill -0 "$QPID" 2>/dev/null; do
    if [[ -e $OUT/.cmd-started ]]; then
      T1=$(trap '' INT TERM HUP; date +%s.%N)   # as T0
      if [[ $QUIET == 0 ]]; then tail -s 0.2 -n +1 -F --pid="$QPID" "$OUT/output.log" 2>/dev/null & TAILPID=$!; fi
      break
    fi
    if (( $(date +%s) - ${T0%.*} >= BOOT_LIMIT )); then
      HUNG=1; stop_boot; wait "$QPID" 2>/dev/null || true
      break
    fi
    # || true: a TERM or HUP sent to the whole process group (CI's limit) kills the sleep too,
    # and set -e took its status for this script's failure: it ended with 143, not as below.
    sleep 0.1 || true
  done
  [[ $STOPPED == 0 ]] || break
  # A guest that ended before the command (a panic while booting; -no-reboot ends qemu) is
  # booted once more too.
  if [[ $HUNG == 0 && ! -e $OUT/.cmd-started && $attempt < $ATTEMPTS ]] && ! kill -0 "$QPID" 2>/dev/null; then
    wait "$QPID" 2>/dev/null || true
    log "the guest ended before the command (a failed boot): booting again (console of that boot: $OUT/console-failed-boot.log)"
    mv "$OUT/console.log" "$OUT/console-failed-boot.log" 2>/dev/null || true
    rm -f "$OUT"/{exit_code,output.log,setup.log,guest-timings,dmesg.log,qemu.pid} "$OUT"/*.rc
    continue
  fi
  [[ $HUNG == 1 && $attempt < $ATTEMPTS ]] || break
  log "the guest did not reach the command in ${BOOT_LIMIT}s (a hung boot): booting again (console of that boot: $OUT/console-hung-boot.log)"
  mv "$OUT/console.log" "$OUT/console-hung-boot.log" 2>/dev/null || true
  rm -f "$OUT"/{.cmd-started,exit_code,output.log,setup.log,guest-timings,dmesg.log,qemu.pid} "$OUT"/*.rc
done
QRC=0
if [[ $HUNG == 1 ]]; then
  QRC="killed: hung while booting ($ATTEMPTS time(s))"
else
  wait "$QPID" || QRC=$?
fi
rm -f "$OUT/qemu.pid"   # qemu is gone: its pid may be another process's from now on
[[ -z $TAILPID ]] || wait "$TAILPID" 2>/dev/null || true
T2=$(date +%s.%N)
[[ -n $T1 || ! -e $OUT/.cmd-started ]] || T1=$T2
BOOT=$([[ -n $T1 ]] && echo "$T1 - $T0" | bc || echo none) TOTAL=$(echo "$T2 - $T0" | bc)
{ printf 'boot_to_command_s=%s\ntotal_s=%s\nqemu_rc=%s\n' "$BOOT" "$TOTAL" "$QRC"; cat "$OUT/guest-timings" 2>/dev/null || true; } > "$OUT/timings"
if [[ -n $T1 && -s $OUT/exit_code ]]; then
  [[ $QUIET == 0 ]] || cat "$OUT/output.log"
  RC=$(cat "$OUT/exit_code")
  log "exit $RC, boot to command ${BOOT}s, total ${TOTAL}s"
  exit "$RC"
fi
log "the VM did not complete the command (qemu rc $QRC; 124 = VM timeout ${VM_TIMEOUT}s). Console tail:"
tail -n 30 "$OUT/console.log" >&2 || true
[[ -s $OUT/console.log ]] || log "(console empty: the kernel boots quietly; rerun with -v for its messages)"
cat "$OUT/qemu.stderr" >&2 || true
[[ ! -s $OUT/output.log ]] || { log "output tail:"; tail -n 30 "$OUT/output.log" >&2; }
exit 125

# ---------------------------------------------------------------- guest side
#### INIT
#!/bin/sh
# initramfs /init: host root over 9p (ro) + tmpfs overlay, the run dir, then stage2.
export PATH=/bin
busybox mount -t proc proc /proc
busybox mount -t sysfs sysfs /sys
busybox mount -t devtmpfs devtmpfs /dev
busybox --install -s /bin
for m in $(cat /modules/order); do insmod /modules/$m || echo "rxe-vm-init: insmod $m failed"; done
fail() { echo "rxe-vm-init: FATAL: $*"; poweroff -f; }
for w in $(cat /proc/cmdline); do
  case $w in rxevm.out=*) OUTP=${w#*=};; rxevm.rw=*) RWS=${w#*=};; esac
done
O="trans=virtio,version=9p2000.L,msize=512000"
i=0; until grep -qs rxeout /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag || [ $i -ge 100 ]; do sleep 0.1; i=$((i+1)); done
mount -t 9p -o ro,cache=loose,$O hostroot /lower || fail "cannot mount hostroot"
mount -t tmpfs -o mode=755,size=50% tmpfs /upper && mkdir /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || fail "overlay"
mkdir -p "/newroot$OUTP" && mount -t 9p -o cache=mmap,$O rxeout "/newroot$OUTP" || fail "cannot mount the run dir"
for tp in $(echo "$RWS" | tr , ' '); do
  mkdir -p "/newroot${tp#*:}" && mount -t 9p -o cache=mmap,$O "${tp%%:*}" "/newroot${tp#*:}" || echo "rxe-vm-init: cannot mount ${tp#*:}"
done
for m in proc sys dev; do mount --move /$m /newroot/$m; done
exec switch_root /newroot /bin/bash "$OUTP/stage2.sh"
#### END INIT

#### STAGE2
#!/bin/bash
# stage2: PID 1 in the guest, on the host's userland. Set up RDMA, run cmd.sh, power off.
OUT=$(dirname "$0")
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb LANG=C.UTF-8
trap 'sync; echo 1 > /proc/sys/kernel/sysrq; busybox poweroff -f; echo o > /proc/sysrq-trigger' EXIT
source "$OUT/params.sh"
read -r up _ < /proc/uptime; echo "guest_uptime_stage2_s=$up" > "$OUT/guest-timings"
log() { echo "rxe-vm-guest: $*" | tee -a "$OUT/setup.log" > /dev/console; }
mkdir -p /dev/pts /dev/shm && mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run && mkdir /run/lock
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
for f in fd:self/fd stdin:self/fd/0 stdout:self/fd/1 stderr:self/fd/2; do ln -sfn "/proc/${f#*:}" "/dev/${f%%:*}"; done
hostname rxe-vm
ip link set lo up
mkdir -p "/lib/modules/$KVER" && mount --bind "$MODDIR" "/lib/modules/$KVER"
ulimit -l unlimited
ulimit -n 65536
export RXE_VM_OUT=$OUT RXE_DEV= RXE_NETDEV= RXE_IP= RXE_PEER_IP= RXE_SETUP
NICDEV=
if [[ -n $NIC_MAC ]]; then # the wire to the other guest: find the NIC by its MAC
  modprobe virtio_net >> "$OUT/setup.log" 2>&1 || log "modprobe virtio_net failed"
  for ((i = 0; i < 50; i++)); do
    for n in /sys/class/net/*; do
      read -r a < "$n/address" && [[ $a == "$NIC_MAC" ]] && NICDEV=${n##*/}
    done
    [[ -z $NICDEV ]] || break
    sleep 0.1
  done
  { [[ -n $NICDEV ]] && ip link set "$NICDEV" up && ip addr add "$NIC_IP" dev "$NICDEV"; } >> "$OUT/setup.log" 2>&1 ||
    log "NIC $NIC_MAC not set up"
fi
if [[ $RXE == 1 && -n $NICDEV ]]; then
  modprobe -a rdma_rxe ib_uverbs rdma_ucm ib_umad >> "$OUT/setup.log" 2>&1 || log "modprobe failed"
  if rdma link add rxe0 type rxe netdev "$NICDEV" >> "$OUT/setup.log" 2>&1; then
    RXE_DEV=rxe0 RXE_NETDEV=$NICDEV RXE_IP=${NIC_IP%/*} RXE_PEER_IP=$NIC_PEER
  else
    log "rdma link add rxe0 on $NICDEV failed"
  fi
elif [[ $RXE == 1 && -z $NIC_MAC ]]; then # (a guest whose NIC is missing gets no rxe0 at all)
  modprobe -a rdma_rxe ib_uverbs rdma_ucm ib_umad veth >> "$OUT/setup.log" 2>&1 || log "modprobe failed"
  if env=$("$RXE_SETUP" 2>> "$OUT/setup.log"); then
    set -a; eval "$env"; set +a
  else
    log "rxe-setup failed: $(tail -n 3 "$OUT/setup.log")"
  fi
fi
echo "RXE_DEV=$RXE_DEV RXE_NETDEV=$RXE_NETDEV RXE_IP=$RXE_IP RXE_PEER_IP=$RXE_PEER_IP" >> "$OUT/setup.log"
cd "$CWD" 2>/dev/null || cd /
read -r up _ < /proc/uptime; echo "guest_uptime_command_s=$up" >> "$OUT/guest-timings"
: > "$OUT/.cmd-started"
if [[ $RXE == 1 && -z $RXE_DEV ]]; then
  # Without rxe0 every RDMA test would skip and the run would look green.
  echo "rxe-vm: no soft-RoCE device came up (see setup.log): the command was not run" > "$OUT/output.log"
  rc=125
else
  timeout -k 5 "$CMD_TIMEOUT" /bin/bash "$OUT/cmd.sh" > "$OUT/output.log" 2>&1 < /dev/null
  rc=$?
fi
dmesg > "$OUT/dmesg.log" 2>&1   # before exit_code: a host that sees exit_code finds it
echo $rc > "$OUT/exit_code"
log "command exited with $rc"
#### END STAGE2
