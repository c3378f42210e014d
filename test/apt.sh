# test/apt.sh - installs Debian packages for the scripts under test/ (source it; bash only):
# test/lib.sh and test/vm/rxe-vm.sh, which runs on its own. Its messages go to stderr, so that
# a script's stdout stays its own.

export DEBIAN_FRONTEND=noninteractive
# A fresh machine's unattended-upgrades may hold dpkg's lock for minutes: apt-get waits for it
# (apt >= 1.9.11; bookworm has 2.6) instead of failing at once.
APT_WAIT=(-o DPkg::Lock::Timeout=600)

# while_locked CMD...: runs CMD again, each LOCK_POLL seconds for up to LOCK_WAIT seconds,
# while it fails on a lock another process holds. APT_WAIT covers dpkg's lock only: apt-get
# update fails at once on the package lists' lock and a download on the archive cache's (a
# fresh machine's apt-daily holds them for minutes), and dpkg fails at once on its own. Any
# other failure returns at once. CMD's stderr is printed when it returns.
LOCK_WAIT=${LOCK_WAIT:-600} LOCK_POLL=${LOCK_POLL:-1}
while_locked() {
  local start=$SECONDS next=0 rc err
  err=$(mktemp) || return
  while :; do
    "$@" 2>"$err" && rc=0 || rc=$?
    if ((rc == 0)) || ! grep -qE 'Could not get lock|Unable to lock|(is|was) locked' "$err" ||
      ((SECONDS - start >= LOCK_WAIT)); then
      cat "$err" >&2; rm -f "$err"; return $rc
    fi
    if ((SECONDS - start >= next)); then
      printf '==> %s: waiting for another process: %s\n' "$1" "$(grep -m1 -E 'lock' "$err")" >&2
      next=$((next + 30))
    fi
    sleep "$LOCK_POLL"
  done
}

# apt_install PKG...: installs those of PKG that are not installed; apt-get update runs only when
# the install fails without it (stale lists). An install cut short before (^C, CI's limit) is
# finished first: it blocks apt-get until then.
apt_install() {
  local missing=() p
  for p; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then printf '==> Debian packages: all %d present\n' $# >&2; return 0; fi
  printf '==> installing Debian packages: %s\n' "${missing[*]}" >&2
  while_locked dpkg --configure -a >&2 || true   # a failure of its own is apt-get's to report
  while_locked apt-get "${APT_WAIT[@]}" install -y --no-install-recommends "${missing[@]}" >&2 ||
    { while_locked apt-get "${APT_WAIT[@]}" update >&2 &&
      while_locked apt-get "${APT_WAIT[@]}" install -y --no-install-recommends "${missing[@]}" >&2; }
}
