package main

import (
	"context"
	"fmt"
	"io"
	"os"
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
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = run(ctx, options{mode: "xrc", fabric: true, nodes: nodes, procs: procs, clients: clients, json: true, size: 64, count: 1, conns: 1, depth: 1})
	os.Stderr = saved
	w.Close()
	out := <-done
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
