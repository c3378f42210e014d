//go:build linux && cgo

package verbs

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRegMRExplainsMemlock: a registration over RLIMIT_MEMLOCK, in a process
// without CAP_IPC_LOCK, fails with ENOMEM and says which limit to raise. The
// test runs itself again under setpriv with CAP_IPC_LOCK dropped (root has
// it, and the kernel then ignores the limit), and that child lowers its
// limit to 1 MiB. Needs $RXE_DEV.
func TestRegMRExplainsMemlock(t *testing.T) {
	if os.Getenv("GOXRC_MEMLOCK_CHILD") == "1" {
		memlockChild(t)
		return
	}
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("no soft-RoCE device (RXE_DEV unset): run through the VM harness")
	}
	setpriv, err := exec.LookPath("setpriv") // util-linux, on every Debian
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock",
		os.Args[0], "-test.run=^TestRegMRExplainsMemlock$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "GOXRC_MEMLOCK_CHILD=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestRegMRExplainsMemlock") {
		t.Fatal("the child did not run the test")
	}
}

func memlockChild(t *testing.T) {
	if capEff, _, ok := procStatus(); !ok || capEff&(1<<unix.CAP_IPC_LOCK) != 0 {
		t.Fatalf("CAP_IPC_LOCK is still effective under setpriv (or /proc/self/status unread: %v)", ok)
	}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	pd, err := openRXE(t).AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	small, err := pd.RegMR(64<<10, AccessLocalWrite)
	if err != nil {
		t.Fatalf("64 KiB under a 1 MiB limit: %v", err)
	}
	defer small.Close()
	mr, err := pd.RegMR(4<<20, AccessLocalWrite)
	if err == nil {
		mr.Close()
		t.Fatal("4 MiB registered under a 1 MiB RLIMIT_MEMLOCK without CAP_IPC_LOCK")
	}
	t.Log(err)
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("error %v, want ENOMEM", err)
	}
	for _, want := range []string{"RLIMIT_MEMLOCK", "1024 KiB for this process", "CAP_IPC_LOCK", "registering 4194304 bytes beside 64 KiB pinned"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestProcStatus: the fields memlockHint reads are there (every Linux
// since 3.2 has VmPin) and a registration-free process pins nothing.
func TestProcStatus(t *testing.T) {
	_, pinned, ok := procStatus()
	if !ok {
		t.Fatal("CapEff or VmPin missing from /proc/self/status")
	}
	if pinned != 0 && Counts().IsZero() {
		t.Errorf("VmPin %d KiB with no registration", pinned)
	}
}
