package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
)

func TestOptionsCheck(t *testing.T) {
	ok := options{addr: "10.0.0.1:7471", mode: "echo", size: 64, count: 1, conns: 1, depth: 2, nodes: 2, procs: 4, clients: 4}
	if err := ok.check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for name, mod := range map[string]func(*options){
		"unknown mode":       func(o *options) { o.mode = "bogus" },
		"raw latency":        func(o *options) { o.raw, o.mode = true, "latency" },
		"no connections":     func(o *options) { o.mode, o.conns = "connect", 0 },
		"negative conns":     func(o *options) { o.mode, o.conns = "connect", -1 },
		"huge conns":         func(o *options) { o.mode, o.conns = "connect", math.MaxInt },
		"no messages":        func(o *options) { o.count = 0 },
		"negative size":      func(o *options) { o.size = -1 },
		"depth 1":            func(o *options) { o.depth = 1 },
		"too many nodes":     func(o *options) { o.mode, o.fabric, o.nodes = "xrc", true, 255 },
		"negative procs":     func(o *options) { o.mode, o.fabric, o.procs = "xrc", true, -1 },
		"no fabric clients":  func(o *options) { o.mode, o.fabric, o.clients = "xrc", true, 0 },
		"huge fabric":        func(o *options) { o.mode, o.fabric, o.nodes, o.procs, o.clients = "xrc", true, 254, 1000, 1000 },
		"overflowing procs":  func(o *options) { o.mode, o.fabric, o.procs, o.clients = "xrc", true, math.MaxInt, 4 },
		"procs past ports":   func(o *options) { o.mode, o.fabric, o.nodes, o.procs, o.clients = "xrc", true, 1, 20001, 1 },
		"clients past ports": func(o *options) { o.mode, o.fabric, o.nodes, o.procs, o.clients = "xrc", true, 1, 1, 20001 },
		"fabric in echo":     func(o *options) { o.fabric = true },
		"nodes in latency":   func(o *options) { o.mode, o.given = "latency", flagBit("nodes") },
		"procs sans fabric":  func(o *options) { o.mode, o.given = "xrc", flagBit("procs") },
	} {
		o := ok
		mod(&o)
		if o.check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The XRC demo on the in-memory fabric: every client reaches every server
// process, and the run reports its connections and its time.
func TestXRCDemoOnFabric(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := options{mode: "xrc", fabric: true, nodes: 2, procs: 3, clients: 2, json: true, size: 64, count: 1, conns: 1, depth: 64}
	r, err := run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 2*3*2 || r.Seconds <= 0 || r.Addr != "" {
		t.Fatalf("result %+v, want 12 connections, a time, no address", r)
	}
}

// -raw without -size sends 16 bytes, the one receive rdma-core's rdma_server
// posts (the general default, 64, fails there); a -size given wins, and
// without -raw the default stays 64.
func TestRawDefaultSize(t *testing.T) {
	for _, tc := range []struct {
		args []string
		size int
	}{
		{[]string{"-raw"}, 16},
		{[]string{"-raw", "-addr", "10.0.0.1:1"}, 16},
		{[]string{"-raw", "-size", "64"}, 64},
		{[]string{"-size", "64", "-raw"}, 64},
		{[]string{"-raw", "-size", "16"}, 16},
		{[]string{"-raw", "-mode", "connect"}, 16},
		{nil, 64},
		{[]string{"-size", "100"}, 100},
	} {
		o, _, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), tc.args)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if o.size != tc.size {
			t.Errorf("%q: size %d, want %d", tc.args, o.size, tc.size)
		}
	}
}

// parseFlags fills every default that main used to set on the global flag
// set, so that the options it returns pass check.
func TestParseFlagsDefaults(t *testing.T) {
	o, prof, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := options{addr: "10.77.0.1:7471", mode: "echo", size: 64, count: 1000, warmup: 100, conns: 100,
		depth: 64, nodes: 2, procs: 4, clients: 4, progress: 2 * time.Second, busyPoll: cm.DefaultBusyPoll,
		keepalive: 10 * time.Second}
	if o != want || prof != "" {
		t.Fatalf("defaults %+v, %q; want %+v, no profile", o, prof, want)
	}
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, _, err := parseFlags(fs, []string{"-bogus"}); err == nil {
		t.Fatal("unknown flag accepted")
	}
	// A fabric's size given without -fabric (the client would dial the
	// device at -addr, ignoring it) is refused, as is -fabric outside
	// -mode xrc; with both it is a run.
	for args, ok := range map[string]bool{
		"-mode xrc -nodes 3":         false,
		"-mode latency -fabric":      false,
		"-mode xrc -fabric -procs 2": true,
	} {
		err := checkArgs(t, args)
		if (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
}

// A negative -progress was taken for 0 (no progress line) without a word,
// and a negative -busypoll passed the checks and failed only at the dial
// (exit status 1, as a run that failed); the other flags' negative values
// are refused up front. Both are refused by check, naming the flag.
func TestNegativeDurationsRefused(t *testing.T) {
	for args, flag := range map[string]string{
		"-mode xrc -fabric -progress -1s": "-progress",
		"-mode latency -progress -1ns":    "-progress",
		"-mode echo -busypoll -1us":       "-busypoll",
		"-mode latency -keepalive -1s":    "-keepalive",
	} {
		err := checkArgs(t, args)
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: check %v, want %s refused", args, err, flag)
		}
	}
	if err := checkArgs(t, "-progress 0 -busypoll 0"); err != nil {
		t.Errorf("-progress 0 -busypoll 0: %v", err)
	}
}

// Connect mode's failed dials come back as one line: up to -conns lines,
// most alike, went to stderr before.
func TestDialsFailedOneLine(t *testing.T) {
	refused := errors.New("refused")
	errs := make([]error, 100)
	for i := 10; i < 50; i++ {
		errs[i] = refused
		if i%2 == 1 {
			errs[i] = context.DeadlineExceeded
		}
	}
	err := dialsFailed(errs)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "40 of 100 dials failed") || !errors.Is(err, refused) {
		t.Fatalf("dialsFailed: %v, want one line of 40 failures of 100, the first's error wrapped", err)
	}
	if err := dialsFailed(make([]error, 3)); err != nil {
		t.Fatalf("no failures: %v", err)
	}
}

// -json says the message size also when it is 0 (an echo of empty
// messages), not only when it is not.
func TestJSONSizeZero(t *testing.T) {
	b, err := json.Marshal(result{Mode: "echo", Count: 3})
	if err != nil || !strings.Contains(string(b), `"size":0`) {
		t.Fatalf("%s (%v): want size 0 given", b, err)
	}
}

// -json gives each of a mode's figures, a 0 too (the MB/s of a bandwidth
// run of empty messages), and none of another mode's.
func TestJSONFiguresOfTheMode(t *testing.T) {
	b, err := json.Marshal(result{Mode: "bandwidth", Count: 100, BandwidthFigures: streamed(0, 100, 0.5)})
	if err != nil || !strings.Contains(string(b), `"mb_per_s":0,"msgs_per_s":200`) || strings.Contains(string(b), "_us") {
		t.Fatalf("%s (%v): want mb_per_s 0, msgs_per_s 200, no latency or connect figure", b, err)
	}
	b, err = json.Marshal(result{Mode: "latency", Count: 1, LatencyFigures: &LatencyFigures{}})
	if err != nil || !strings.Contains(string(b), `"min_us":0,"median_us":0,"p99_us":0`) || strings.Contains(string(b), "per_s") {
		t.Fatalf("%s (%v): want the three latency figures, no bandwidth one", b, err)
	}
}
