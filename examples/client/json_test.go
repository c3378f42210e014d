package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// The fabric demo's point is its table of QPs against what RC would need,
// but with -json the table went to stderr as text and stdout's JSON held
// only the mode, the size, the count and the time: a script asking for
// JSON got none of what the demo shows. The JSON, and nothing else on
// stdout, carries each node's row. The test runs main in a child process
// (this test binary, asked by the environment).
func TestXRCDemoJSONHasTable(t *testing.T) {
	mainexec.Child("client", main)
	const nodes, procs, clients = 2, 3, 2
	stdout, stderr, code := mainexec.Run(t, "-mode xrc -fabric -nodes 2 -procs 3 -clients 2 -json -progress 1ms")
	if code != 0 {
		t.Fatalf("exit status %d, stderr %q", code, stderr)
	}
	var got struct {
		Mode  string `json:"mode"`
		Count int    `json:"count"`
		Nodes []struct {
			Node       string `json:"node"`
			INIs       int    `json:"inis"`
			TGTs       int    `json:"tgts"`
			TGTHandles int    `json:"tgt_handles"`
			XRCQPs     int    `json:"xrc_qps"`
			RCQPs      int    `json:"rc_qps"`
		} `json:"nodes"`
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value on stdout:\n%s", stdout)
	}
	if got.Mode != "xrc" || got.Count != nodes*procs*clients || len(got.Nodes) != 1+nodes {
		t.Fatalf("JSON %+v: want mode xrc, %d connections and a row for the client node and each of %d server nodes", got, nodes*procs*clients, nodes)
	}
	c := got.Nodes[0]
	if c.Node != "client" || c.INIs != clients*nodes || c.XRCQPs != c.INIs+c.TGTs || c.RCQPs != clients*nodes*procs {
		t.Errorf("client row %+v: want %d INIs, XRC QPs = INIs + TGTs, RC %d", c, clients*nodes, clients*nodes*procs)
	}
	for _, s := range got.Nodes[1:] {
		if !strings.HasPrefix(s.Node, "server") || s.INIs != procs || s.TGTs != clients || s.TGTHandles != clients*procs ||
			s.XRCQPs != procs+clients || s.RCQPs != clients*procs {
			t.Errorf("server row %+v: want %d INIs, %d TGTs, %d handles, RC %d", s, procs, clients, clients*procs, clients*procs)
		}
	}
}
