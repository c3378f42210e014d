package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakes are the commands test/vm/guest.sh calls that need a soft-RoCE
// guest, made to act on files in $STATE: rping's client fails while
// $STATE/wedged exists; rdma resource show counts a user context and a
// CM id on rxe0 while $STATE/held exists; rdma link delete fails while
// $STATE/stuck exists and otherwise clears wedged unless $STATE/for-good
// exists. Each call is logged in $STATE/calls; sleep returns at once.
var fakes = map[string]string{
	"rping": `echo "rping $*" >> "$STATE/calls"
[[ $1 == -s ]] && exit 0
[[ -e $STATE/wedged ]] && { echo "rdma_connect: timed out"; exit 1; }
exit 0`,
	"rdma": `echo "rdma $*" >> "$STATE/calls"
case "$1 $2" in
"resource show") n=0; [[ -e $STATE/held ]] && n=1
  echo "0: rxe0: pd 1 cq 1 qp 1 cm_id $n mr 0 ctx $n srq 0";;
"link delete") [[ -e $STATE/stuck ]] && exit 1; [[ -e $STATE/for-good ]] || rm -f "$STATE/wedged";;
esac
exit 0`,
	"sleep": `exit 0`,
	"dmesg": `echo "[    1.0] infiniband rxe0: set active"`,
}

// guestRun runs test/vm/guest.sh's run on a test binary that exits with
// rc, with the fakes first on PATH and the files named in state made; it
// returns the state directory (the fakes' calls) and the output directory.
func guestRun(t *testing.T, rc string, state ...string) (stateDir, out string) {
	t.Helper()
	dir := t.TempDir()
	bin, stateDir, out := fakeCommands(t, dir, fakes), filepath.Join(dir, "state"), filepath.Join(dir, "out")
	for _, d := range []string{stateDir, out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range append(state, "calls") {
		if err := os.WriteFile(filepath.Join(stateDir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	test := filepath.Join(bin, "pkg.test")
	if err := os.WriteFile(test, []byte("#!/bin/bash\necho '--- PASS: TestA (0.00s)'\nexit "+rc+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", `source ../vm/guest.sh && run pkg "$1" "$2"`, "bash", dir, test)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "STATE="+stateDir, "RXE_VM_OUT="+out,
		"RXE_DEV=rxe0", "RXE_NETDEV=veth0", "RXE_IP=10.77.0.1", "TEST_TIMEOUT=1m")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run: %v: %s", err, b)
	}
	if got, err := os.ReadFile(filepath.Join(out, "pkg.rc")); err != nil || strings.TrimSpace(string(got)) != rc {
		t.Fatalf("pkg.rc: %q, %v; want %s", got, err, rc)
	}
	return stateDir, out
}

func readOrEmpty(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// TestGuestRunRemakesAWedgedDevice: before each binary the guest checks
// with rping that the kernel's CM on the device answers; where it does
// not, it keeps the evidence, makes the device again and says so, and
// where that does not help either, says that too. A binary that fails
// leaves the same evidence.
func TestGuestRunRemakesAWedgedDevice(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this machine: the harness is bash")
	}
	const remade = "before pkg: the kernel's CM on rxe0 did not answer rping; the device was "
	for _, c := range []struct {
		name, rc string
		state    []string
		wedged   string // wedged.log; "" for none
		diag     string // in diag.log; "" for no diag.log
		delete   bool   // rdma link delete called
		remake   bool   // and rdma link add
	}{
		{name: "healthy", rc: "0"},
		{name: "healthy, the binary fails", rc: "1", diag: "--- after pkg failed"},
		{name: "wedged, made again", rc: "0", state: []string{"wedged"},
			wedged: remade + "made again (diag.log)\n", diag: "--- before pkg: rping failed on rxe0", delete: true, remake: true},
		{name: "wedged for good", rc: "0", state: []string{"wedged", "for-good"},
			wedged: remade + "made again, and rping still fails (diag.log)\n", diag: "rping client: rdma_connect: timed out", delete: true, remake: true},
		{name: "wedged, the device cannot be deleted", rc: "0", state: []string{"wedged", "stuck"},
			wedged: remade + "could not be made again, and rping still fails (diag.log)\n", diag: "rping on rxe0: failed", delete: true},
		{name: "wedged, a process holds the device", rc: "0", state: []string{"wedged", "held"},
			wedged: remade + "not made again: processes hold it (cm_id 1 ctx 1), and rping still fails (diag.log)\n", diag: "rping on rxe0: failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			state, out := guestRun(t, c.rc, c.state...)
			if got := readOrEmpty(t, filepath.Join(out, "wedged.log")); got != c.wedged {
				t.Errorf("wedged.log %q, want %q", got, c.wedged)
			}
			diag := readOrEmpty(t, filepath.Join(out, "diag.log"))
			if c.diag == "" && diag != "" || !strings.Contains(diag, c.diag) {
				t.Errorf("diag.log %q, want it to hold %q", diag, c.diag)
			}
			calls := readOrEmpty(t, filepath.Join(state, "calls"))
			add := strings.Contains(calls, "rdma link add rxe0 type rxe netdev veth0")
			if strings.Contains(calls, "rdma link delete rxe0") != c.delete || add != c.remake {
				t.Errorf("calls:\n%s\nwant link delete %v, link add %v", calls, c.delete, c.remake)
			}
			if !strings.Contains(calls, "rping -c -a 10.77.0.1") {
				t.Errorf("no rping client on RXE_IP; calls:\n%s", calls)
			}
		})
	}
}
