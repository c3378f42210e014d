package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// vmFakes are the commands test/vm/rxe-vm.sh calls that would install
// packages, load modules or boot a guest. The fake qemu keeps the /init of
// the initramfs it boots (init.N, N counting the boots) and does what the
// guest's stage2 does with rxe-setup: it runs $RXE_SETUP of the run's
// params.sh, once $RELEASE exists (a guest's boot takes a while), and keeps
// its output as the command's. With $FAIL_FIRST_BOOT set, its first boot
// ends there instead, before the command, as a failed boot does.
var vmFakes = map[string]string{
	"dpkg-query": `printf 'install ok installed'`,
	"modprobe":   `exit 0`,
	"qemu-system-x86_64": `while [[ $# -gt 0 ]]; do
  case $1 in -pidfile) pidfile=$2; shift 2;; -append) append=$2; shift 2;; -initrd) initrd=$2; shift 2;; *) shift;; esac
done
echo $$ > "$pidfile"
for w in $append; do case $w in rxevm.out=*) OUT=${w#*=};; esac; done
n=$(($(cat "$OUT/boots" 2>/dev/null || echo 0) + 1)); echo $n > "$OUT/boots"
gzip -dc "$initrd" | cpio -i --quiet --to-stdout init > "$OUT/init.$n"
source "$OUT/params.sh"
until [[ -e $RELEASE ]]; do sleep 0.05; done
[[ -n ${FAIL_FIRST_BOOT:-} && $n == 1 ]] && exit 1
: > "$OUT/.cmd-started"
"$RXE_SETUP" > "$OUT/output.log" 2>&1
echo $? > "$OUT/exit_code"`,
}

// checkout makes a copy of what test/vm/rxe-vm.sh needs of a checkout under
// dir, with an rxe-setup that says which checkout it was built from, and a
// guest /init that says so too.
func checkout(t *testing.T, dir, name string) string {
	t.Helper()
	files := map[string]string{
		"go.mod":                     "module example.com/checkout\n\ngo 1.26\n",
		"test/cmd/rxe-setup/main.go": "package main\n\nfunc main() { println(\"rxe-setup of checkout " + name + "\") }\n",
	}
	for _, f := range []string{"test/vm/rxe-vm.sh", "test/apt.sh"} {
		b, err := os.ReadFile(filepath.Join("..", strings.TrimPrefix(f, "test/")))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	const init = "#### INIT\n#!/bin/sh\n"
	if !strings.Contains(files["test/vm/rxe-vm.sh"], init) {
		t.Fatalf("test/vm/rxe-vm.sh has no %q", init)
	}
	files["test/vm/rxe-vm.sh"] = strings.Replace(files["test/vm/rxe-vm.sh"], init, init+"# init of checkout "+name+"\n", 1)
	root := filepath.Join(dir, name)
	for f, body := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(root, "test/vm/rxe-vm.sh")
}

// TestVMRunUsesItsOwnBuilds: runs of test/vm/rxe-vm.sh may overlap (only
// their preparation is serialized), also runs of two checkouts sharing the
// work dir (/var/cache/goxrc-vm). A guest runs rxe-setup as it boots, after
// its run's preparation, and a guest whose boot failed is booted again
// minutes later: it must run the rxe-setup, and boot the initramfs, of its
// own checkout, not those another checkout's preparation built meanwhile.
func TestVMRunUsesItsOwnBuilds(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox")
	t.Run("boot", func(t *testing.T) { vmRunOfTwoCheckouts(t, false) })
	// A failed boot is booted again, with the initramfs of the first.
	t.Run("second boot", func(t *testing.T) { vmRunOfTwoCheckouts(t, true) })
}

// vmRunOfTwoCheckouts runs rxe-vm.sh of checkout a, and while its guest
// boots, rxe-vm.sh --prepare of checkout b with the same work dir.
func vmRunOfTwoCheckouts(t *testing.T, failFirstBoot bool) {
	dir := t.TempDir()
	bin, work := fakeCommands(t, dir, vmFakes), filepath.Join(dir, "work")
	kernel := map[string]string{}
	fakeKernel(kernel, work)
	writeFiles(t, kernel)
	vmA, vmB := checkout(t, dir, "a"), checkout(t, dir, "b")
	release := filepath.Join(dir, "release")
	env := append(os.Environ(), "PATH="+bin+":"+filepath.Join(runtime.GOROOT(), "bin")+":"+os.Getenv("PATH"),
		"GOXRC_VM_WORK="+work, "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false", "RELEASE="+release)

	outA := filepath.Join(dir, "out-a")
	runA := exec.Command("bash", vmA, "-q", "-t", "300", "-o", outA, "true")
	runA.Env = env
	if failFirstBoot {
		runA.Env = append(runA.Env, "FAIL_FIRST_BOOT=1")
	}
	logA, err := os.Create(filepath.Join(dir, "a.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logA.Close()
	runA.Stdout, runA.Stderr = logA, logA
	if err := runA.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // closed when run a has ended, with its result in errA
	var errA error
	go func() { errA = runA.Wait(); close(done) }()
	t.Cleanup(func() {
		os.WriteFile(release, nil, 0o644)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			runA.Process.Kill()
		}
	})
	logOf := func() string { b, _ := os.ReadFile(logA.Name()); return string(b) }

	// Checkout a's guest is booting: checkout b prepares meanwhile.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b, _ := os.ReadFile(filepath.Join(outA, "qemu.pid")); len(b) > 0 {
			break
		}
		select {
		case <-done:
			t.Fatalf("checkout a's run ended before its guest booted (%v):\n%s", errA, logOf())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkout a's guest did not boot:\n%s", logOf())
		}
		time.Sleep(50 * time.Millisecond)
	}
	prepB := exec.Command("bash", vmB, "--prepare")
	prepB.Env = env
	if out, err := prepB.CombinedOutput(); err != nil {
		t.Fatalf("checkout b's rxe-vm.sh --prepare: %v\n%s", err, out)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if errA != nil {
			t.Fatalf("checkout a's run: %v\n%s", errA, logOf())
		}
	case <-time.After(time.Minute):
		t.Fatalf("checkout a's run did not end:\n%s", logOf())
	}
	got, err := os.ReadFile(filepath.Join(outA, "output.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), "rxe-setup of checkout a") {
		t.Errorf("checkout a's guest ran %q, want checkout a's rxe-setup", strings.TrimSpace(string(got)))
	}
	boots, _ := os.ReadFile(filepath.Join(outA, "boots"))
	n := strings.TrimSpace(string(boots))
	if want := map[bool]string{false: "1", true: "2"}[failFirstBoot]; n != want {
		t.Fatalf("checkout a's guest booted %q times, want %s:\n%s", n, want, logOf())
	}
	init, err := os.ReadFile(filepath.Join(outA, "init."+n))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(init), "# init of checkout a\n") {
		t.Errorf("checkout a's guest booted (boot %s) with an initramfs whose /init is not checkout a's:\n%s", n, init)
	}
}
