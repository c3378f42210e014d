package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// An argument that is not a flag ends flag parsing: the flags after it were
// dropped and the run went ahead (client -mode xrc -fabric extra -json
// printed its table, not JSON; client 10.0.0.1:7471 -mode latency dialed
// the default address in echo mode). It is refused, naming the argument.
func TestStrayArgumentRefused(t *testing.T) {
	for _, args := range []string{
		"-mode xrc -fabric extra -json",
		"10.0.0.1:7471 -mode latency",
		"-mode latency -- -count 5",
	} {
		_, _, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), "unexpected argument") {
			t.Errorf("%s: %v, want unexpected argument", args, err)
		}
	}
}

// The fabric demo runs its servers in the program and dials none of -addr
// or -local: given with -fabric they were ignored without a word (client
// -mode xrc -fabric -addr 10.0.0.5:7471 ran, and said nothing of the server
// the user named). They are refused; without -fabric, -addr is the run.
func TestFabricRefusesAddr(t *testing.T) {
	for args, ok := range map[string]bool{
		"-mode xrc -fabric -addr 10.0.0.5:7471": false,
		"-mode xrc -fabric -addr garbage":       false,
		"-mode xrc -fabric -local 10.0.0.2":     false,
		"-mode xrc -addr 10.0.0.5:7471":         true,
		"-mode xrc -fabric":                     true,
	} {
		err := checkArgs(t, args)
		if (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
}

// A flag the run does not use was ignored without a word: client -mode
// connect -size 65536 -depth 128 timed dials of 64-byte, depth-2
// connections; -mode xrc -fabric -busypoll 0 changed nothing; -warmup
// outside latency, -count with -raw, in connect or xrc mode, and -conns
// outside connect did nothing. Each is refused, naming the flag and the run.
func TestIgnoredFlagRefused(t *testing.T) {
	for _, tc := range []struct{ args, flag, run string }{
		{"-mode connect -size 65536", "size", "connect"},
		{"-mode connect -depth 128", "depth", "connect"},
		{"-mode connect -busypoll 0", "busypoll", "connect"},
		{"-mode connect -count 5", "count", "connect"},
		{"-mode connect -warmup 5", "warmup", "connect"},
		{"-mode connect -raw -size 16", "size", "connect"},
		{"-mode xrc -fabric -busypoll 0", "busypoll", "xrc -fabric"},
		{"-mode xrc -fabric -count 5", "count", "xrc -fabric"},
		{"-mode xrc -fabric -warmup 5", "warmup", "xrc -fabric"},
		{"-mode xrc -fabric -conns 5", "conns", "xrc -fabric"},
		{"-mode xrc -count 5", "count", "xrc"},
		{"-mode xrc -warmup 5", "warmup", "xrc"},
		{"-mode xrc -conns 5", "conns", "xrc"},
		{"-mode echo -warmup 5", "warmup", "echo"},
		{"-mode echo -conns 5", "conns", "echo"},
		{"-raw -count 5", "count", "echo -raw"},
		{"-raw -warmup 5", "warmup", "echo -raw"},
		{"-raw -conns 5", "conns", "echo -raw"},
		{"-mode latency -conns 5", "conns", "latency"},
		{"-mode bandwidth -warmup 5", "warmup", "bandwidth"},
		{"-mode bandwidth -conns 5", "conns", "bandwidth"},
	} {
		err := checkArgs(t, tc.args)
		want := "-" + tc.flag + " has no effect in -mode " + tc.run
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: check %v, want %q", tc.args, err, want)
		}
	}
}

// Refusing ignored flags must not refuse a flag a run uses: the command
// lines of test/run-demo.sh and test/bench.sh, and each run with every flag
// it uses given.
func TestUsedFlagsAccepted(t *testing.T) {
	common := " -json -progress 1s -cpuprofile p -mode "
	for _, args := range []string{
		"-addr 10.0.0.1:7471 -mode connect -conns 50",
		"-addr 10.0.0.1:7471 -mode connect -raw -conns 100 -json -progress 0",
		"-mode xrc -fabric -nodes 2 -procs 4 -clients 4",
		"-mode xrc -addr 10.0.0.1:7474",
		"-addr 10.0.0.1:7472 -raw -size 16",
		"-addr 10.0.0.1:7471 -depth 128 -mode bandwidth -size 4096 -count 2000 -busypoll 20ms -json -progress 0",
		"-addr 10.0.0.1:7471 -local 10.0.0.2 -size 8 -depth 4 -busypoll 0 -count 5" + common + "echo",
		"-addr 10.0.0.1:7471 -local 10.0.0.2 -size 8 -depth 4 -busypoll 0 -raw" + common + "echo",
		"-addr 10.0.0.1:7471 -local 10.0.0.2 -size 8 -depth 4 -busypoll 0 -count 5 -warmup 0" + common + "latency",
		"-addr 10.0.0.1:7471 -local 10.0.0.2 -size 8 -depth 4 -busypoll 0 -count 5" + common + "bandwidth",
		"-addr 10.0.0.1:7471 -local 10.0.0.2 -conns 3 -raw" + common + "connect",
		"-addr 10.0.0.1:7471,10.0.0.3:7471 -local 10.0.0.2 -size 8 -depth 4 -busypoll 0" + common + "xrc",
		"-fabric -nodes 1 -procs 1 -clients 1 -size 8 -depth 4" + common + "xrc",
	} {
		err := checkArgs(t, args)
		if err != nil {
			t.Errorf("%s: %v", args, err)
		}
	}
}

// Every flag has its entry in flagRuns (a flag without one would never be
// refused), and each has a bit in options.given.
func TestFlagRunsComplete(t *testing.T) {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	parseFlags(fs, nil)
	fs.VisitAll(func(f *flag.Flag) {
		if flagBit(f.Name) == 0 {
			t.Errorf("-%s: not in flagRuns", f.Name)
		}
	})
	if len(flagRuns) > 32 {
		t.Errorf("%d flags: options.given has 32 bits", len(flagRuns))
	}
}

// A refused command line (client -cpuprofile cpu.out -mode bogus, or one
// giving a flag its run ignores) exits with status 2 and leaves an earlier
// run's -cpuprofile file as it was: main refuses its flags before it
// creates the profile's file. It guards against main refusing them only
// after, which truncated the earlier run's profile. The test runs main in a
// child process (this test binary, asked by the environment).
func TestRefusalKeepsProfile(t *testing.T) {
	mainexec.Child("client", main)
	mainexec.RefusalKeepsProfile(t, map[string]string{"-mode bogus": `unknown mode "bogus"`, "-mode connect -depth 8": "-depth has no effect"})
}

// checkArgs parses a command line (no program name) and checks it, as main
// does; a flag that does not parse fails t.
func checkArgs(t *testing.T, args string) error {
	t.Helper()
	o, _, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), strings.Fields(args))
	if err != nil {
		t.Fatal(err)
	}
	return o.check()
}

// A boolean flag given as false asks for nothing: client -mode latency
// -raw=false (a script's -raw=$RAW) was refused, saying -raw has no effect
// in latency mode, and -mode xrc -fabric=false that -fabric is for -mode
// xrc -fabric. The server takes -raw=false (TestIgnoredFlagAccepts); the
// client does too, and still refuses the flags when true.
func TestFalseBoolFlagAccepted(t *testing.T) {
	for args, ok := range map[string]bool{
		"-mode latency -raw=false":                    true,
		"-mode bandwidth -raw=false -fabric=false":    true,
		"-mode xrc -fabric=false -addr 10.0.0.1:7471": true,
		"-mode echo -fabric=false -raw=false":         true,
		"-mode latency -raw=true":                     false,
		"-mode echo -fabric=true":                     false,
		"-mode xrc -fabric=false -nodes 2":            false,
	} {
		err := checkArgs(t, args)
		if (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
}

// A client whose server's node vanished without a word waited for ever for
// a reply or a report: it sent no keepalive probes (the server does,
// -keepalive). It does by default now, except where no probe can go (-raw)
// or nothing waits (connect mode), and the flag is refused there.
func TestKeepaliveFlag(t *testing.T) {
	for args, ok := range map[string]bool{
		"-mode latency -keepalive 1s":     true,
		"-mode bandwidth -keepalive 0":    true,
		"-mode echo -raw -keepalive 1s":   false,
		"-mode connect -keepalive 1s":     false,
		"-mode xrc -fabric -keepalive 1s": false,
		"-mode echo -raw":                 true, // the default is not given
	} {
		err := checkArgs(t, args)
		if (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
	o, _, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, conn := o, o
	raw.raw, conn.mode = true, "connect"
	if n := len(o.dialOptions()); o.keepalive <= 0 || n != 1 || len(raw.dialOptions()) != 1 || len(conn.dialOptions()) != 0 {
		t.Fatalf("default keepalive %v gives %d dial options (raw %d, connect %d), want the probe's alone (raw: the raw option alone; connect: none)",
			o.keepalive, n, len(raw.dialOptions()), len(conn.dialOptions()))
	}
}

// A value out of range was refused by one line giving every flag's range
// (client -count 0: "-size and -warmup must be 0 or more, -count and -conns
// 1 or more, -depth 2 or more"), and -depth over 4000 or -size over 1 GiB
// passed the checks to fail at the dial, with exit status 1 and after
// -cpuprofile's file was truncated. Each is refused with exit status 2,
// naming its flag and value.
func TestBadValueNamed(t *testing.T) {
	mainexec.Child("client", main)
	for args, want := range map[string]string{
		"-count 0":                   "-count 0: must be 1 or more",
		"-mode latency -count -5":    "-count -5: must be 1 or more",
		"-size -1":                   "-size -1: must be 0 to 1073741824",
		"-size 1073741825":           "-size 1073741825: must be 0 to 1073741824",
		"-mode latency -warmup -1":   "-warmup -1: must be 0 or more",
		"-mode connect -conns 0":     "-conns 0: must be 1 to 65536",
		"-mode connect -conns 65537": "-conns 65537: must be 1 to 65536",
		"-depth 1":                   "-depth 1: must be 2 to 4000",
		"-mode xrc -depth 4001":      "-depth 4001: must be 2 to 4000",
	} {
		if err := checkArgs(t, args); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: check %v, want %q", args, err, want)
		}
	}
	for _, args := range []string{"-depth 4000 -size 1073741824", "-size 0", "-mode connect -conns 65536"} {
		if err := checkArgs(t, args); err != nil {
			t.Errorf("%s: check %v", args, err)
		}
	}
	mainexec.RefusalKeepsProfile(t, map[string]string{"-depth 4001": "-depth 4001", "-size 1073741825": "-size 1073741825"})
}

// Outside xrc mode a malformed -addr passed the checks and failed at the
// dial, with exit status 1 as a failed run and after -cpuprofile's file
// was truncated (xrc mode checked its list already). It is refused, with
// exit status 2, before anything.
func TestAddrChecked(t *testing.T) {
	mainexec.Child("client", main)
	for args, ok := range map[string]bool{
		"-addr 10.0.0.1":                  false,
		"-mode latency -addr host":        false,
		"-mode connect -addr 10.0.0.1:":   false,
		"-mode bandwidth -addr host:7471": true,
		"-raw -addr [fd00::1]:7471":       true,
		"-mode xrc -fabric -procs 1":      true, // the default -addr, unused
	} {
		if err := checkArgs(t, args); (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
	mainexec.RefusalKeepsProfile(t, map[string]string{"-addr 10.0.0.1": `-addr entry "10.0.0.1" is not ip:port`})
}
