# test/vm/guest.sh - functions for the guest script test/run-tests.sh writes (sourced in the
# VM, where RXE_DEV RXE_NETDEV RXE_IP and RXE_VM_OUT are set; TEST_TIMEOUT and BESIDE_ENV come
# from that script). test/harness runs them on the host against fake rping and rdma commands.

run() { # NAME DIR BIN [ARGS]: a test binary, its output in $RXE_VM_OUT/NAME.log, its status in NAME.rc
  echo "=== $1 ($2)"
  healthy "$1"
  (cd "$2" && "$3" -test.v -test.count=1 -test.timeout="$TEST_TIMEOUT" "${@:4}") 2>&1 | tee "$RXE_VM_OUT/$1.log"
  local rc=${PIPESTATUS[0]}
  echo "$rc" > "$RXE_VM_OUT/$1.rc"
  [[ $rc == 0 ]] || diag "after $1 failed" >> "$RXE_VM_OUT/diag.log" 2>&1
}

beside() { # NAME DIR BIN [ARGS]: run in the background on the second device, output in its log only
  if [[ ${#BESIDE_ENV[@]} == 0 ]]; then echo "=== $1: no second device"; return; fi
  echo "=== $1 ($2), in the background on ${BESIDE_ENV[0]#*=}"
  (export "${BESIDE_ENV[@]}"
   cd "$2" && "$3" -test.v -test.count=1 -test.timeout="$TEST_TIMEOUT" "${@:4}" > "$RXE_VM_OUT/$1.log" 2>&1
   rc=$?; echo "$rc" > "$RXE_VM_OUT/$1.rc"
   [[ $rc == 0 ]] || diag "after $1 failed" >> "$RXE_VM_OUT/diag.log" 2>&1) &
}

rping_ok() { # whether rdma-core's rping connects to itself on $RXE_IP: the kernel's CM and the
  # device work, whatever this library does (a second try: the server may not listen yet)
  local port=$((7000 + RANDOM % 1000)) server ok=1 out=$RXE_VM_OUT/rping-$RXE_DEV
  timeout 40 rping -s -a "$RXE_IP" -p "$port" -C 1 > "$out.s" 2>&1 &
  server=$!
  sleep 0.5
  timeout 15 rping -c -a "$RXE_IP" -p "$port" -C 1 -S 64 > "$out.c" 2>&1 ||
    { sleep 1; timeout 15 rping -c -a "$RXE_IP" -p "$port" -C 1 -S 64 > "$out.c" 2>&1; } || ok=0
  [[ $ok == 1 ]] || kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  [[ $ok == 1 ]]
}

healthy() { # NAME: before a binary, if rping cannot connect on $RXE_DEV, the kernel's CM there has
  # stopped answering (in one CI run every connection on rxe0 timed out from one binary on,
  # cause unknown; README). Keep the evidence, say so (the host prints it), and make the device
  # again, so that what follows tests this library, not a wedged device.
  rping_ok && return
  { diag "before $1: rping failed on $RXE_DEV"
    echo "rping client: $(tail -c 300 "$RXE_VM_OUT/rping-$RXE_DEV.c" | tr '\n' ' ')"; } >> "$RXE_VM_OUT/diag.log" 2>&1
  local how="made again" users
  # A device's deletion waits, in the kernel and for ever, until every process has let go of it
  # (soft-RoCE cannot take a device from a process): not while any holds a context or CM id.
  users=$(rdma resource show "$RXE_DEV" 2>&1 | grep -oE '(ctx|cm_id) [1-9][0-9]*' | tr '\n' ' ')
  if [[ -n $users ]]; then
    how="not made again: processes hold it (${users% })"
  elif ! { timeout -k 5 60 rdma link delete "$RXE_DEV" && rdma link add "$RXE_DEV" type rxe netdev "$RXE_NETDEV"; } \
    >> "$RXE_VM_OUT/diag.log" 2>&1; then
    how="could not be made again"
  else
    sleep 2 # the new device's GIDs come from its netdev's addresses, asynchronously
  fi
  rping_ok || how+=", and rping still fails"
  echo "before $1: the kernel's CM on $RXE_DEV did not answer rping; the device was $how (diag.log)" |
    tee -a "$RXE_VM_OUT/wedged.log"
}

counters() { # DEV: the device's non-zero kernel CM and soft-RoCE counters, on one line
  local c f line="$1:"
  for c in cm_tx_msgs cm_tx_retries cm_rx_msgs cm_rx_duplicates; do
    line+=" $c"
    for f in /sys/class/infiniband/"$1"/ports/1/$c/*; do
      [[ $(cat "$f" 2>/dev/null || echo 0) == 0 ]] || line+=" ${f##*/}=$(cat "$f")"
    done
  done
  line+=" hw"
  for f in /sys/class/infiniband/"$1"/ports/1/hw_counters/*; do
    [[ $(cat "$f" 2>/dev/null || echo 0) == 0 ]] || line+=" ${f##*/}=$(cat "$f")"
  done
  echo "$line"
}

diag() { # WHEN: what the guest looks like now: each device's counters, whether rping connects on
  # $RXE_DEV (and the counters after it), RDMA resources, CM ids and QP1, processes, the kernel's log
  local d
  echo "--- $1 ($(date +%T))"
  for d in /sys/class/infiniband/*; do [[ -e $d ]] && counters "${d##*/}"; done
  if rping_ok; then echo "rping on $RXE_DEV: connected"; else echo "rping on $RXE_DEV: failed"; fi
  counters "$RXE_DEV"
  rdma resource show
  rdma resource show cm_id | head -n 20
  # The MAD layer's QP: one failed send on it may leave soft-RoCE's receive side in error for
  # good while it reads RTS (a reading of the 6.1 source; not reproduced here): then sent_pkts
  # grows and rcvd_pkts does not.
  rdma resource show qp link "$RXE_DEV/1" lqpn 1
  ps --ppid 2 -p 2 --deselect -o pid,ppid,stat,etime,wchan:24,args | grep -v ' ps --ppid' | head -n 20
  ps -eo pid,stat,wchan:24,comm | awk '$2 ~ /D/' | head -n 10
  dmesg | grep -iE 'rxe|infiniband|ib_cm|ib_mad|rdma|blocked' | grep -iv 'command line' | tail -n 15
}
