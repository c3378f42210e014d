package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The fabric demo's point is its table: each client process reaches every
// server node over one uplink (one INI per node, whatever the number of
// server processes sharing that node's domain), and each node holds fewer
// XRC QPs than RC would need. TestXRCDemoOnFabric checks only the number
// of connections echoed, so a demo whose dials each got their own uplink,
// or whose table printed any numbers, passed.
func TestXRCDemoTable(t *testing.T) {
	const nodes, procs, clients = 2, 3, 2
	out, err := runStderr(t, 20*time.Second, options{mode: "xrc", fabric: true, nodes: nodes, procs: procs, clients: clients, json: true, size: 64, count: 1, conns: 1, depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][5]int{}
	for _, line := range strings.Split(out, "\n") {
		var name string
		var v [5]int
		if n, _ := fmt.Sscanf(line, "%s %d %d %d %d %d", &name, &v[0], &v[1], &v[2], &v[3], &v[4]); n == 6 {
			rows[name] = v
		}
	}
	if len(rows) != 1+nodes {
		t.Fatalf("table rows %v in\n%s", rows, out)
	}
	// INIs, TGTs, TGT handles, XRC QPs, RC would need.
	c := rows["client"]
	if c[0] != clients*nodes {
		t.Errorf("client INIs %d, want one per client process and server node (%d)\n%s", c[0], clients*nodes, out)
	}
	if c[4] != clients*nodes*procs || c[3] != c[0]+c[1] || c[3] >= c[4] {
		t.Errorf("client: %d XRC QPs (INIs+TGTs %d), RC %d (want %d and more than XRC)\n%s", c[3], c[0]+c[1], c[4], clients*nodes*procs, out)
	}
	for i := range nodes {
		s := rows[fmt.Sprintf("server%d", i)]
		if s[0] != procs || s[1] != clients || s[2] != clients*procs || s[3] != s[0]+s[1] || s[4] != clients*procs || s[3] >= s[4] {
			t.Errorf("server%d: %v, want %d INIs, %d TGTs, %d TGT handles, fewer QPs than RC's %d\n%s", i, s, procs, clients, clients*procs, clients*procs, out)
		}
	}
}

// The fabric demo ignored -size and -depth: its connections took cm's
// defaults and echoed a short label whatever -size said. Each connection
// now echoes a message of -size bytes, on connections sized by -size and
// -depth on both sides: 1 MiB (16 times cm's default message size, so
// neither side may keep the default) goes through at depth 2, one byte
// more than the fabric carries fails the send, and a depth cm refuses
// fails the run; before, all three ran.
func TestXRCDemoFabricSizeAndDepth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	demo := func(size, depth int) (result, error) {
		return run(ctx, options{mode: "xrc", fabric: true, nodes: 2, procs: 2, clients: 2, json: true, size: size, count: 1, conns: 1, depth: depth})
	}
	r, err := demo(1<<20, 2)
	if err != nil || r.Count != 2*2*2 || r.Size != 1<<20 {
		t.Errorf("-size 1048576 -depth 2: %+v, %v; want 8 connections echoing 1 MiB", r, err)
	}
	if _, err := demo(1<<20+1, 2); err == nil || !strings.Contains(err.Error(), "message too long: 1048577 bytes") {
		t.Errorf("-size 1048577 (over the fabric's 1 MiB): %v, want the send refused", err)
	}
	if _, err := demo(64, 4001); err == nil || !strings.Contains(err.Error(), "queue depth 4001") {
		t.Errorf("-depth 4001: %v, want cm's refusal", err)
	}
}

// The xrc mode showed no progress line whatever -progress said. With
// -progress it counts the connections echoed: 64 on the fabric, each a
// set-up and an exchange, take many times the 100 us interval.
func TestXRCDemoProgress(t *testing.T) {
	out, err := runStderr(t, 60*time.Second, options{mode: "xrc", fabric: true, nodes: 4, procs: 4, clients: 4, json: true, size: 64, count: 1, conns: 1, depth: 64, progress: 100 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^xrc: \d+/64 after `).MatchString(out) {
		t.Fatalf("no progress line in\n%s", out)
	}
}

// runStderr runs o, with a timeout, and returns what it wrote to stderr
// (with -json, the demo's table and the progress lines).
func runStderr(t *testing.T, timeout time.Duration, o options) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = run(ctx, o)
	os.Stderr = saved
	w.Close()
	return <-done, err
}
